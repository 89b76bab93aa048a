"""The TensorRT engine: model.plan built beside the fp32 graph and checked against it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prensa.export.checks import agreement_report, run_onnx, sample_batch
from prensa.export.formats.fp16 import to_fp16
from prensa.export.run import ONNX_FILE, ExportFormat, ExportRun
from prensa.export.source import SourceError
from prensa.manifest import TensorRTEngine
from prensa.stages import contract


def applies(run: ExportRun) -> bool:
    """When the export asks for `--format tensorrt`."""
    return run.options.format is ExportFormat.TENSORRT


def apply(run: ExportRun) -> None:
    """model.plan beside the fp32 model.onnx, checked against it through the TensorRT runtime."""
    from prensa.export.formats import tensorrt

    graph, tokenizer, plan = run.graph, run.tokenizer, run.plan
    options, step = run.options, run.step
    if graph.dtype != "fp32":
        raise SourceError(f"--format tensorrt builds from an fp32 graph; this one is {graph.dtype}")
    profile = tensorrt.engine_profile(
        plan.max_length, options.trt_max_batch, options.trt_opt_batch, options.trt_opt_length
    )
    onnx_path, plan_path = options.out / ONNX_FILE, options.out / tensorrt.ENGINE_FILE
    sample = sample_batch(tokenizer, plan.kind, plan.max_length)
    with step("Running the fp32 graph for reference outputs"):
        expected = run_onnx(onnx_path, graph.inputs, sample)
    with tempfile.TemporaryDirectory(dir=options.out) as staging:
        source = onnx_path
        if options.served_dtype == "fp16":
            source = Path(staging) / ONNX_FILE
            with step("Converting a copy to fp16 (LayerNorm and softmax kept in fp32)"):
                to_fp16(onnx_path, source, options.external_data)
        with step(
            f"Building the {options.served_dtype} TensorRT engine, {tensorrt.describe_profile(profile)}"
        ):
            version = tensorrt.build_engine(source, plan_path, profile)
    with step("Running the engine on a sample batch"):
        actual = tensorrt.EngineRunner(plan_path).run({n: sample[n] for n in graph.inputs})
    checked = agreement_report(
        "TensorRT",
        actual,
        expected,
        sample[contract.ATTENTION_MASK],
        graph.outputs,
        prefix="tensorrt ",
    )
    run.engine = TensorRTEngine(tensorrt.ENGINE_FILE, options.served_dtype, version, profile)
    described = f"TensorRT {version}, {options.served_dtype}, {tensorrt.describe_profile(profile)}"
    run.add_figures(
        {**checked.figures, "tensorrt engine": described},
        checked.ok,
        f"{run.report.heading}; {checked.heading}",
    )
