"""int8: the fp32 graph swapped for its dynamically quantised version, for CPUs."""

from __future__ import annotations

from pathlib import Path

from prensa.export.formats.graph_store import move_graph, staging
from prensa.export.formats.onnx_graph import GraphInfo
from prensa.export.run import ONNX_FILE, ExportRun
from prensa.export.source import SourceError


def applies(run: ExportRun) -> bool:
    """When the export asks for int8 (`--quantize int8`)."""
    return run.options.quantize_int8


def apply(run: ExportRun) -> None:
    """Swap the fp32 graph in `out` for its int8 version; add the agreement figures to the report."""
    from prensa.export.formats.quantize import quantize_with_report

    graph, tokenizer, plan = run.graph, run.tokenizer, run.plan
    options, step = run.options, run.step
    if graph.dtype != "fp32":
        raise SourceError(f"--quantize int8 needs an fp32 graph; this one is {graph.dtype}")
    with staging(options.out, "fp32") as folder:
        fp32 = Path(folder) / ONNX_FILE
        move_graph(options.out / ONNX_FILE, fp32)  # with its data file: the graph names it
        try:
            with step(
                "Quantising to int8 (per-tensor and per-channel) and comparing with fp32 on the workload"
            ):
                result = quantize_with_report(
                    fp32,
                    options.out / ONNX_FILE,
                    graph.inputs,
                    tokenizer,
                    plan.kind,
                    plan.pooling,
                    plan.max_length,
                    options.external_data,
                    plan.template,
                )
        except BaseException:
            # a failed quantisation leaves the fp32 export as it was
            move_graph(fp32, options.out / ONNX_FILE)
            raise
    figures = {}
    for label, values in result.figures.items():
        kept = " (kept)" if (label == "per-channel") == result.per_channel else ""
        figures[f"int8 {label}{kept}"] = ", ".join(f"{k} {v:.4f}" for k, v in values.items())
    run.graph = GraphInfo(graph.inputs, graph.outputs, "int8", graph.fused_ops)
    run.add_figures(figures)
