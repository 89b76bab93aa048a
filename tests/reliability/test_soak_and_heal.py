"""`prensa loadtest soak` and `prensa loadtest heal` on prensa's own `up`, briefly: both serve,
load, report and stop everything they started. Their verdict logic is checked on samples made to
pass and to fail."""

from __future__ import annotations

import re
import shutil

import psutil
import pytest
from typer.testing import CliRunner

from prensa.bench.soak import Load, load_report, memory_report
from prensa.cli import app


@pytest.fixture
def work(tmp_path, exports):
    """A --work folder whose exports `prensa up` reuses: an embedder and a reranker."""
    for name in ("minilm", "reranker"):
        shutil.copytree(exports[name], tmp_path / "models" / name)
    return tmp_path


def tritons_serving(repo) -> list[psutil.Process]:
    """Running tritonservers whose command line names `repo` (other tests' Tritons are not ours)."""
    return [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "tritonserver" and str(repo) in " ".join(p.info["cmdline"] or ())]


def test_soak_passes_a_short_steady_load_and_writes_its_samples(work):
    result = CliRunner().invoke(app, ["loadtest", "soak", "--work", str(work), "--model", "minilm=unused",
                                      "--model", "reranker=unused", "--minutes", "0.15", "--concurrency", "2",
                                      "--sample-every", "0.5"])
    assert result.exit_code == 0, result.output
    assert "verdict: PASS" in result.output
    assert re.search(r"embeddings\s+\d+ requests .*200: \d+", result.output)
    assert re.search(r"rerank\s+\d+ requests .*200: \d+", result.output)
    rows = (work / "soak-memory.csv").read_text().splitlines()
    assert rows[0] == "seconds,process,pid,rss_mb" and any("tritonserver" in row for row in rows[1:])
    assert not tritons_serving(work / "model_repo")  # its Triton is gone


def test_heal_reports_each_kill_and_the_embedder_heals(work):
    result = CliRunner().invoke(app, ["loadtest", "heal", "--work", str(work), "--model", "minilm=unused",
                                      "--model", "reranker=unused", "--kills", "1", "--gap", "8",
                                      "--concurrency", "4"])
    assert result.exit_code == 0, result.output
    assert "kill 1:" in result.output
    assert "none failed" in result.output or re.search(r"healed in \d+\.\d+ s", result.output), result.output
    assert not tritons_serving(work / "model_repo")


def test_the_verdicts_fail_steady_growth_and_server_errors():
    steady = [(float(t), "stub m_encode", 7, 100.0 + (t % 2) * 0.05) for t in range(0, 600, 3)]
    growing = [(float(t), "stub m_encode", 8, 100.0 + t / 6) for t in range(0, 600, 3)]  # 10 MB/min
    assert memory_report(steady, max_slope=2.0)[1]
    assert not memory_report(growing, max_slope=2.0)[1]
    load = Load()
    load.statuses["embeddings"].update({200: 10, 429: 2})
    load.latencies["embeddings"] += [0.01] * 12
    assert load_report(load, minutes=1.0)[1] == 0  # 429 is overload answered, not an error
    load.statuses["embeddings"].update({503: 1, "ConnectError": 1})
    assert load_report(load, minutes=1.0)[1] == 2
