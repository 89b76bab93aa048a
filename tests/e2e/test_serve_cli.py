"""`prensa serve` exits non-zero with Triton's own error when a model cannot load."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from prensa.addresses import free_port
from prensa.cli import app
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, ServingOptions, build_repository

pytestmark = pytest.mark.triton


def test_serve_reports_model_load_failure(tmp_path, exports):
    build_repository([ModelSource("broken", exports["minilm"], Manifest.read(exports["minilm"]))], tmp_path,
                     ServingOptions())
    graph = tmp_path / "broken_encode" / "1" / "model.onnx"
    graph.unlink()  # a hard link to the shared export: never write through it
    graph.write_bytes(b"not an onnx graph")
    ports = [str(free_port()) for _ in range(3)]
    result = CliRunner().invoke(app, ["serve", "--repo", str(tmp_path), "--http-port", ports[0],
                                      "--grpc-port", ports[1], "--metrics-port", ports[2]])
    assert result.exit_code == 1
    assert "broken_encode" in result.output
    shutil.rmtree(tmp_path)
