"""The fp16 graph: half-precision weights and compute, for GPUs (an fp16 ONNX export, and the graph
a TensorRT engine builds from)."""

from __future__ import annotations

from pathlib import Path

from prensa.export.formats.graph_store import save_graph


def to_fp16(source: Path, target: Path, external: bool) -> None:
    """fp16 weights and compute, fp32 inputs/outputs; LayerNorm and softmax stay fp32 (overflow).
    TensorRT builds from the same graph, strongly typed, so both keep those layers in fp32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # By path: onnxruntime then infers shapes from the file, which works past 2 GB (in memory it cannot).
    converted = convert_float_to_float16(
        str(source),
        keep_io_types=True,
        op_block_list=["LayerNormalization", "Softmax", "Pow", "ReduceMean", "Sqrt"],
    )
    save_graph(converted, target, external)
