"""`prensa export` never runs code pickled into a model directory: a `pytorch_model.bin` or a bge-m3
head file whose pickle calls a function is refused with a clear error, and the function never
runs (its marker file is never written). The payload is live: plain `torch.load` runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prensa.cli import app
from prensa.export.pipeline import ExportOptions, export_model
from prensa.export.source import SourceError
from tests.tiny_models import tiny_bge_m3, tiny_reranker


class Payload:
    """Unpickling this writes a file: the stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "pickled code ran")


def plant(path: Path, marker: Path) -> None:
    torch.save(Payload(marker), path)
    torch.load(path, weights_only=False)  # proves the payload works when unpickled naively
    assert marker.exists()
    marker.unlink()


def test_weights_pickle_with_code_is_refused(tmp_path):
    model = tiny_reranker(tmp_path / "model")
    (model / "model.safetensors").unlink()  # only the pickle is left to load
    marker = tmp_path / "marker"
    plant(model / "pytorch_model.bin", marker)
    with pytest.raises(SourceError, match="pickle holding more than tensors"):
        export_model(ExportOptions(str(model), tmp_path / "out"))
    assert not marker.exists()
    result = CliRunner().invoke(app, ["export", str(model), "--out", str(tmp_path / "cli-out")])
    assert result.exit_code != 0 and "safetensors" in result.output
    assert not marker.exists()


def test_safetensors_win_over_a_pickle_beside_them(tmp_path):
    model = tiny_reranker(tmp_path / "model")
    marker = tmp_path / "marker"
    plant(model / "pytorch_model.bin", marker)
    export_model(ExportOptions(str(model), tmp_path / "out"))
    assert (tmp_path / "out" / "model.onnx").exists() and not marker.exists()


def test_head_file_with_code_is_refused(tmp_path):
    model = tiny_bge_m3(tmp_path / "m3")
    marker = tmp_path / "marker"
    plant(model / "sparse_linear.pt", marker)
    with pytest.raises(SourceError, match=r"sparse_linear\.pt is a pickle holding more than tensors"):
        export_model(ExportOptions(str(model), tmp_path / "out"))
    assert not marker.exists()
