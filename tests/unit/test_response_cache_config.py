"""Triton's response cache, without Triton: which rendered configs turn it on (none by default, and
only the models whose answers it can key), the command line that gives Triton a cache, the warning
when the two disagree, and the hit and miss counters `prensa stats` reads."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prensa.cli import app
from prensa.manifest import Manifest, Task
from prensa.triton.config import parse_pbtxt
from prensa.triton.launcher import MIN_CACHE_BYTES, TritonOptions, triton_command
from prensa.triton.metrics import parse_metrics
from prensa.triton.repo import (
    CACHED_TASKS,
    ModelSource,
    Pipeline,
    ServingOptions,
    build_repository,
    cache_refusal,
    cached_models,
)

serve_cli = importlib.import_module("prensa.cli.serve")  # `prensa.cli` exports the function under the module's name
CACHE_SIZE = 64 << 20


def sources(exports: dict[str, Path], suffix: str = "") -> list[ModelSource]:
    return [ModelSource(f"{name}{suffix}", path, Manifest.read(path)) for name, path in exports.items()]


def caching(repo: Path) -> dict[str, bool]:
    """Every rendered model and whether its config turns the response cache on."""
    return {path.parent.name: parse_pbtxt(path.read_text()).response_cache.enable for path in repo.glob("*/config.pbtxt")}


def test_no_config_turns_the_cache_on_by_default(tmp_path, exports):
    build_repository(sources(exports), tmp_path, ServingOptions())
    build_repository(sources(exports, "-fused"), tmp_path, ServingOptions(pipeline=Pipeline.FUSED))
    rendered = caching(tmp_path)
    assert len(rendered) == 5 * len(exports)  # four models per ensemble, one per fused model
    assert not any(rendered.values())
    assert all("response_cache" not in path.read_text() for path in tmp_path.glob("*/config.pbtxt"))
    assert cached_models(tmp_path) == []


def test_the_flag_caches_embedding_and_splade_ensembles_only(tmp_path, exports):
    build_repository(sources(exports), tmp_path, ServingOptions(response_cache=True))
    build_repository(sources(exports, "-fused"), tmp_path, ServingOptions(pipeline=Pipeline.FUSED, response_cache=True))
    tasks = {name: Manifest.read(path).task for name, path in exports.items()}
    expected = sorted(name for name, task in tasks.items() if task in CACHED_TASKS)
    assert expected == ["minilm", "minilm-prompts", "splade"]
    assert cached_models(tmp_path) == expected
    assert [name for name, on in caching(tmp_path).items() if on and name not in expected] == []  # no stage, no fused model
    ensemble = parse_pbtxt((tmp_path / "minilm" / "config.pbtxt").read_text())
    assert ensemble.platform == "ensemble" and ensemble.response_cache.enable


@pytest.mark.parametrize("task", list(Task))
def test_every_refusal_says_why(task):
    refusal = cache_refusal(task, Pipeline.ENSEMBLE)
    assert (refusal is None) == (task in CACHED_TASKS)
    if refusal:
        assert "requested outputs" in refusal and task.value in refusal
    assert "token ids" in (cache_refusal(task, Pipeline.FUSED) or "")


def test_repo_build_names_the_models_it_leaves_uncached(tmp_path, exports):
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "repo", "build", f"minilm={exports['minilm']}", f"rerank={exports['reranker']}", "--repo", str(tmp_path),
        "--response-cache"])
    assert result.exit_code == 0, result.output
    assert "response cache on: minilm" in result.output
    assert "not cached: rerank: rerank models are asked for different outputs" in result.output
    assert cached_models(tmp_path) == ["minilm"]


def test_triton_gets_a_cache_only_with_a_size(tmp_path):
    plain = triton_command(TritonOptions(tmp_path))
    assert not [arg for arg in plain if arg.startswith("--cache")]
    cached = triton_command(TritonOptions(tmp_path, cache_bytes=CACHE_SIZE))
    assert f"--cache-config=local,size={CACHE_SIZE}" in cached
    [directory] = [arg.partition("=")[2] for arg in cached if arg.startswith("--cache-directory=")]
    assert (Path(directory) / "local" / "libtritoncache_local.so").is_file()  # the wheel's, not /opt/tritonserver


@pytest.mark.parametrize("size", [-1, 512, MIN_CACHE_BYTES - 1])
def test_a_cache_too_small_to_hold_answers_is_refused(tmp_path, size):
    with pytest.raises(ValueError, match="in bytes"):
        TritonOptions(tmp_path, cache_bytes=size)


@pytest.fixture
def served(monkeypatch) -> list[dict[str, Any]]:
    """`run_triton`'s arguments by name, instead of serving."""
    calls: list[dict[str, Any]] = []
    real = inspect.signature(serve_cli.run_triton)
    monkeypatch.setattr(serve_cli, "run_triton", lambda *a, **kw: calls.append(dict(real.bind(*a, **kw).arguments)))
    monkeypatch.delenv("PRENSA_CACHE_SIZE", raising=False)
    return calls


def test_serve_takes_the_cache_size_from_its_flag_or_variable(served, tmp_path):
    assert CliRunner().invoke(app, ["serve", "--repo", str(tmp_path)]).exit_code == 0
    assert CliRunner().invoke(app, ["serve", "--repo", str(tmp_path), "--cache-size", str(CACHE_SIZE)]).exit_code == 0
    result = CliRunner().invoke(app, ["serve", "--repo", str(tmp_path)], env={"PRENSA_CACHE_SIZE": str(2 * CACHE_SIZE)})
    assert result.exit_code == 0, result.output
    assert [call["options"].cache_bytes for call in served] == [0, CACHE_SIZE, 2 * CACHE_SIZE]
    small = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["serve", "--repo", str(tmp_path), "--cache-size", "512"])
    assert small.exit_code == 2 and "in bytes" in small.output and len(served) == 3


def test_up_with_a_cache_size_builds_cached_ensembles(served, tmp_path, exports):
    """`up` builds its own repository: a cache size turns the cache on there too."""
    models_dir = exports["minilm"].parent
    for size, repo in ((CACHE_SIZE, tmp_path / "cached"), (0, tmp_path / "plain")):
        result = CliRunner().invoke(app, ["up", "--models-dir", str(models_dir), "--model", "minilm=unused",
                                          "--repo", str(repo), "--cache-size", str(size), "--no-gateway"])
        assert result.exit_code == 0, result.output
        assert parse_pbtxt((repo / "minilm" / "config.pbtxt").read_text()).response_cache.enable is (size > 0)
    assert [call["options"].cache_bytes for call in served] == [CACHE_SIZE, 0]


def test_serve_warns_when_the_cache_and_the_repository_disagree(tmp_path, exports):
    build_repository(sources({"minilm": exports["minilm"]}), tmp_path / "cached", ServingOptions(response_cache=True))
    build_repository(sources({"minilm": exports["minilm"]}), tmp_path / "plain", ServingOptions())
    uncached = serve_cli.cache_mismatch(tmp_path / "cached", 0)
    assert uncached and "minilm" in uncached and "--cache-size" in uncached
    unused = serve_cli.cache_mismatch(tmp_path / "plain", CACHE_SIZE)
    assert unused and "--response-cache" in unused
    assert serve_cli.cache_mismatch(tmp_path / "cached", CACHE_SIZE) is None
    assert serve_cli.cache_mismatch(tmp_path / "plain", 0) is None


# What Triton 2.51 exports for a cached model (a plain model has no nv_cache_*_per_model series).
METRICS = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="minilm",version="1"} 10
nv_inference_request_success{model="minilm_encode",version="1"} 4
# TYPE nv_cache_num_hits_per_model counter
nv_cache_num_hits_per_model{model="minilm",version="1"} 6
# TYPE nv_cache_num_misses_per_model counter
nv_cache_num_misses_per_model{model="minilm",version="1"} 4
# TYPE nv_cache_hit_duration_per_model counter
nv_cache_hit_duration_per_model{model="minilm",version="1"} 30
# TYPE nv_cache_miss_duration_per_model counter
nv_cache_miss_duration_per_model{model="minilm",version="1"} 120
# TYPE nv_cache_num_hits gauge
nv_cache_num_hits 6
"""


def test_metrics_carry_cache_hits_and_misses_per_model():
    models = parse_metrics(METRICS)
    cached, encoder = models["minilm"], models["minilm_encode"]
    assert (cached.cache_hits, cached.cache_misses, cached.cache_hit_us, cached.cache_miss_us) == (6, 4, 30, 120)
    assert cached.cache_hit_ratio == pytest.approx(0.6)
    assert encoder.cache_hit_ratio is None and encoder.cache_lookups == 0
    assert (cached - cached).cache_hit_ratio is None
