"""Placing large model files: hard links where the filesystem allows, copies elsewhere."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def link_or_copy(source: Path, target: Path) -> None:
    """Hard link when possible (an 8 GB graph is not duplicated), else copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def link_graph_files(source_dir: Path, target_dir: Path, onnx_file: str) -> None:
    """An ONNX graph plus any external-data files named after it (`model.onnx_data`, ...); not a
    TensorRT engine (`model.plan`) that shares the stem."""
    stem = Path(onnx_file).stem
    for path in source_dir.iterdir():
        if path.is_file() and path.name.startswith(stem) and path.suffix not in (".json", ".plan"):
            link_or_copy(path, target_dir / path.name)
