"""Graphs over 2 GB on tiny models: torch's per-tensor external data imitated, and exports that
keep their weights in `model.onnx.data` whatever their size."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest
from onnx.external_data_helper import set_external_data

from prensa.export import pipeline


@contextmanager
def traced_as_torch_writes_large_graphs() -> Iterator[list[list[str]]]:
    """While active, every trace comes out as torch writes a graph over 2 GB: each weight in a file of
    its own beside the graph, named after the tensor (`onnx__MatMul_123`, ...). Yields, per trace,
    the files the trace left beside its graph."""
    trace = pipeline._trace
    seen: list[list[str]] = []

    def per_tensor(graph, inputs, outputs, sample, path: Path) -> None:
        trace(graph, inputs, outputs, sample, path)
        model = onnx.load(str(path))
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data"):
                set_external_data(tensor, tensor.name.replace("::", "__").replace("/", "_"))
                tensor.data_location = onnx.TensorProto.EXTERNAL
        onnx.save_model(model, str(path))  # writes each external tensor to its file
        seen.append(sorted(p.name for p in path.parent.iterdir() if p != path))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "_trace", per_tensor)
        yield seen


def export_files(directory: Path) -> list[str]:
    """The graph files in an export: the graph and whatever holds its weights, nothing else."""
    return sorted(p.name for p in directory.iterdir()
                  if p.is_dir() or not p.name.endswith((".json", ".txt", ".model")))
