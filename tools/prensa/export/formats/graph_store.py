"""Writing the ONNX graphs an export produces, whatever their size.

A protobuf holds at most 2 GB, so a larger graph (bge-m3 and bge-reranker-v2-m3 in fp32: 2.27 GB)
keeps its weights as external data. torch's exporter writes one file per tensor; an export keeps
one file beside the graph instead (`model.onnx.data`), which every later step (fusion, fp16,
int8, TensorRT, `repo build`) reads through the graph's own external-data entries. Graphs that
fit stay in one file unless external data is asked for.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from prensa.files import graph_data_files

if TYPE_CHECKING:
    import onnx

DATA_SUFFIX = ".data"  # model.onnx -> model.onnx.data
PROTOBUF_LIMIT = 2_000_000_000  # a serialized graph at or past this keeps its weights outside (protobuf stops at 2 GiB)
EXTERNAL_THRESHOLD = 1024  # tensors smaller than this stay inside the graph (onnx's own default)


def data_file(graph: Path) -> Path:
    return graph.with_name(graph.name + DATA_SUFFIX)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers' data as loaded: what decides whether the graph fits a protobuf."""
    return sum(
        len(t.raw_data) + 4 * len(t.float_data) + 8 * len(t.int64_data) + 4 * len(t.int32_data)
        for t in model.graph.initializer
    )


def needs_external_data(model: onnx.ModelProto) -> bool:
    return tensor_bytes(model) >= PROTOBUF_LIMIT


def save_graph(model: onnx.ModelProto, path: Path, external: bool = False) -> None:
    """Write `model` (its weights loaded) to `path`: inside the graph when they fit and `external`
    is not asked, else in one `<name>.data` file beside it. Any data file there before is replaced
    (onnx appends to an existing one). The model's tensors point at that file afterwards."""
    import onnx

    data_file(path).unlink(missing_ok=True)
    external = external or needs_external_data(model)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=data_file(path).name,
        size_threshold=EXTERNAL_THRESHOLD,
    )
    _readable_as_the_graph(path)


def _readable_as_the_graph(graph: Path) -> None:
    """onnx creates data files that only their owner may read; a repository image, or another user
    serving the export, needs them as readable as the graph itself."""
    for name in graph_data_files(graph):
        shutil.copymode(graph, graph.parent / name)


def rewrite_graph(source: Path, target: Path, external: bool = False) -> None:
    """`source` (with whatever external-data files it references) written again at `target` in
    the export's layout: one data file at most."""
    import onnx

    save_graph(onnx.load(str(source)), target, external)


def remove_graph(path: Path) -> None:
    """A graph and the weights files it references."""
    for name in graph_data_files(path):
        (path.parent / name).unlink()
    path.unlink()


def move_graph(source: Path, target: Path) -> None:
    """Move a graph written by `save_graph` (and its data file, if any) over `target`'s; both have
    the same file name, since the graph names its data file."""
    if source.name != target.name:
        raise ValueError(
            f"a graph names its data file after itself: {source.name} cannot become {target.name}"
        )
    data = graph_data_files(source)
    if target.exists():
        remove_graph(target)
    data_file(target).unlink(missing_ok=True)
    for name in data:
        shutil.move(source.parent / name, target.parent / name)
    shutil.move(source, target)
    _readable_as_the_graph(target)


# the steps that write a graph in a folder of their own first
STAGING = (
    "trace",
    "fused",
    "fp32",
    "int8",
)


def staging(parent: Path, step: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder beside the export's graph for `step`'s graph (a graph names its data file
    after itself, so each candidate needs a folder of its own)."""
    assert step in STAGING, step
    return tempfile.TemporaryDirectory(dir=parent, prefix=f".{step}-")


def remove_staging(out: Path) -> None:
    """Staging folders an export killed midway left in `out` (each may hold a whole graph)."""
    for path in out.iterdir():
        if path.is_dir() and path.name.startswith(tuple(f".{step}-" for step in STAGING)):
            shutil.rmtree(path, ignore_errors=True)
