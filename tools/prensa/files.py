"""Placing large model files: hard links where the filesystem allows, copies elsewhere.

An ONNX graph over 2 GB keeps its weights outside the protobuf (ONNX external data); the graph's
tensors name the files, offsets and lengths. Those entries, read from the graph, decide which
files travel with it: never a guess from file names.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


class GraphDataError(ValueError):
    """An ONNX graph's external data is missing, too short, or outside the graph's folder."""


def link_or_copy(source: Path, target: Path) -> None:
    """Hard link when possible (an 8 GB graph is not duplicated), else copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph holds: initializers and node attributes, subgraphs included."""
    import onnx

    yield from graph.initializer
    yield from (sparse.values for sparse in graph.sparse_initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors
            for subgraph in (
                *([attribute.g] if attribute.HasField("g") else []),
                *attribute.graphs,
            ):
                yield from _graph_tensors(subgraph)


def graph_data_files(graph: Path) -> list[str]:
    """The files `graph` keeps its weights in, relative to its folder, each checked to exist, to lie
    inside that folder and to hold every byte the graph reads from it; empty for a self-contained graph."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(graph), load_external_data=False)
    ends: dict[str, int] = {}
    for tensor in _graph_tensors(model.graph):
        if uses_external_data(tensor):
            info = ExternalDataInfo(tensor)
            end = (info.offset or 0) + (info.length or 0)
            ends[info.location] = max(ends.get(info.location, 0), end)
    for location, end in ends.items():
        relative = PurePosixPath(location.replace("\\", "/"))
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise GraphDataError(
                f"{graph}: its weights file {location!r} lies outside the graph's folder"
            )
        path = graph.parent / relative
        if not path.is_file():
            raise GraphDataError(
                f"{graph}: its weights file {location} is missing (expected at {path})"
            )
        if path.stat().st_size < end:
            raise GraphDataError(
                f"{graph}: its weights file {location} holds {path.stat().st_size} bytes, "
                f"the graph reads up to byte {end}"
            )
    return sorted(ends)


def link_graph_files(source_dir: Path, target_dir: Path, onnx_file: str) -> list[str]:
    """Place an ONNX graph and every weights file it references (checked first) in `target_dir`;
    returns the weights files placed."""
    data_files = graph_data_files(source_dir / onnx_file)
    for name in (onnx_file, *data_files):
        (target_dir / name).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(source_dir / name, target_dir / name)
    return data_files
