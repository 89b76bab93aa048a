"""The packed graph: the fused graph in onnxruntime's packing mode, beside an ONNX export."""

from __future__ import annotations

from prensa.export.formats import packing
from prensa.export.run import ONNX_FILE, ExportFormat, ExportRun

PACKED_FIGURE = "packed graph"  # the report line that names the packed graph, or why there is none


def applies(run: ExportRun) -> bool:
    """Always: the step removes a previous export's packed graph, and says in the report why an
    export that asks for one has none."""
    return True


def apply(run: ExportRun) -> None:
    """The packed graph beside an ONNX export that asks for one (`ExportOptions.pack`), and whether
    it was checked against the unpacked graph, or the report's line saying why there is none. Its
    ops run on CUDA only: checked here where onnxruntime's CUDA provider runs, and in any case by the
    encode stage when it loads (`packing`). A packed graph that disagrees is not kept."""
    graph, options, step = run.graph, run.options, run.step
    target = options.out / packing.PACKED_FILE
    target.unlink(missing_ok=True)  # a previous export's, into the same directory
    wanted = options.pack if options.pack is not None else graph.dtype == "fp16"
    if not wanted or options.format is not ExportFormat.ONNX or not run.report.ok:
        return
    pad_id = int(run.tokenizer.pad_token_id or 0)
    if graph.dtype == "int8":
        reason: str | None = "int8 graphs are for CPUs; packing is for onnxruntime's CUDA provider"
    elif run.late_interaction is not None:
        reason = "a late-interaction query holds tokens no token attends to, which packing drops"
    elif not graph.fused_ops:
        reason = "the graph has no fused ops to pack (exported with --no-fuse-ops, or none matched)"
    else:
        with step("Writing the packed graph (padding removed inside the encoder, for CUDA)"):
            reason = packing.write_packed_graph(options.out / ONNX_FILE, target)
    checked = False
    if reason is None and packing.cuda_available():
        with step("Checking the packed graph against the unpacked one on CUDA"):
            reason = packing.check_on_cuda(options.out / ONNX_FILE, target, graph, pad_id)
        checked = reason is None
        if reason:
            target.unlink()
    where = "agrees on CUDA" if checked else "checked on CUDA when the encode stage loads it"
    run.add_figures(
        {PACKED_FIGURE: f"none: {reason}" if reason else f"{packing.PACKED_FILE} ({where})"}
    )
    run.packed_file, run.packed_checked = (None if reason else packing.PACKED_FILE), checked
