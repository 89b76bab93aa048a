"""`prensa bench --quick`, its measures of one part (`gateway`, `tracing`, `cache`) and `prensa tune
--quick` on the test exports: every system present, every figure positive (speed targets live in
the full benchmark, not in tests)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from prensa.bench.tune import TunePoint, best_point, default_grid
from prensa.cli import app
from prensa.triton.config import parse_pbtxt

pytestmark = pytest.mark.triton

# In-process references of every run: the limit before and after the servers, the encode stage alone.
REFERENCES = {"onnxruntime limit", "onnxruntime limit, again after the servers", "encode stage alone (random batches of 32)"}
SYSTEMS = {*REFERENCES, "sentence-transformers (in-process)", "prensa (Triton gRPC)",
           "prensa (gateway HTTP)", "prensa fused (Triton gRPC)", "prensa fused (gateway HTTP)",
           "FastAPI + sentence-transformers"}


@pytest.mark.parametrize("export", ["minilm", "reranker"])
def test_quick_bench_reports_every_system(tmp_path, exports, export):
    result = CliRunner().invoke(app, ["bench", str(exports[export]), "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {s["name"] for s in report["systems"]} >= SYSTEMS
    limits = [s["runs"][0]["seq_per_s"] for s in report["systems"] if s["name"].startswith("onnxruntime limit")]
    assert report["limit"]["measured"] == limits and len(limits) == 2
    for system in report["systems"]:
        assert system["single_query_p50_ms"] > 0
        for run in system["runs"]:
            assert run["seq_per_s"] > 0 and run["tok_per_s"] > 0 and run["vs_limit"] > 0
            assert run.get("errors", 0) == 0
            if system["kind"] == "server":
                assert 0 < run["p50_ms"] <= run["p90_ms"] <= run["p99_ms"]
    assert {p: e["padded_per_real_token"] >= 1.0 for p, e in report["prensa_encoder"].items()} == \
        {"ensemble": True, "fused": True}
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_tune_picks_the_fastest_clean_point_and_writes_it(tmp_path, exports):
    repo = tmp_path / "model_repo"
    result = CliRunner().invoke(app, ["tune", str(exports["minilm"]), "--name", "minilm", "--repo", str(repo),
                                      "--quick", "--requests", "16", "--concurrency", "8"])
    assert result.exit_code == 0, result.output
    grid = default_grid(2, 256, quick=True)
    assert {p.pipeline for p in grid} == {"ensemble", "fused"}
    fused = parse_pbtxt((repo / "minilm" / "config.pbtxt").read_text()).parameters["pipeline"].string_value == "fused"
    assert fused != (repo / "minilm_encode").exists()  # the winner's layout, nothing of the other
    config = parse_pbtxt((repo / ("minilm" if fused else "minilm_encode") / "config.pbtxt").read_text())
    assert config.dynamic_batching.max_queue_delay_microseconds in {p.queue_delay_us for p in grid}
    # Measured as HTTP clients call prensa: through a gateway, which logged every request.
    assert (tmp_path / ".prensa" / "tune-gateway.log").read_text().count("POST /embed") >= 16  # the last point's


def test_the_full_grid_crosses_both_pipelines_with_every_layout():
    grid = default_grid(2, 256, quick=False)
    assert {(p.pipeline, p.instances, p.threads) for p in grid} == \
        {(pipeline, *layout) for pipeline in ("ensemble", "fused") for layout in ((1, 0), (2, 1))}


def test_best_point_prefers_throughput_then_p99_and_skips_errors():
    rows = [dict(instances=1, threads=0, queue_delay_us=0, max_batch_tokens=4096, seq_per_s=50, p99_ms=300, errors=0),
            dict(instances=2, threads=1, queue_delay_us=0, max_batch_tokens=4096, seq_per_s=49, p99_ms=200, errors=0),
            dict(instances=1, threads=0, queue_delay_us=5000, max_batch_tokens=4096, seq_per_s=80, p99_ms=90, errors=3)]
    assert best_point(rows) == TunePoint(2, 1, 0, 4096)


def test_compare_layout_measures_each_encoder_layout(tmp_path, exports):
    result = CliRunner().invoke(app, ["bench", str(exports["minilm"]), "--quick", "--out", str(tmp_path), "--no-peers",
                                      "--no-gateway", "--pipeline", "fused", "--compare-layout", "2x1"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {s["name"] for s in report["systems"]} == {*REFERENCES, "prensa fused 1x0 (Triton gRPC)",
                                                      "prensa fused 2x1 (Triton gRPC)"}
    assert set(report["prensa_encoder"]) == {"fused-1x0", "fused-2x1"}
    # Triton started the second instance only for the 2x1 layout.
    assert "bench_0_1" in (tmp_path / "tritonserver-fused-2x1.log").read_text()
    assert "bench_0_1" not in (tmp_path / "tritonserver-fused-1x0.log").read_text()


def figures(text: str) -> list[float]:
    return [float(number) for number in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", text)]


def test_bench_gateway_measures_the_gateways_own_cpu(tmp_path, exports):
    in_process = CliRunner().invoke(app, ["bench", "gateway", str(exports["minilm"]), "--requests", "20"])
    assert in_process.exit_code == 0, in_process.output
    best, median = figures(in_process.output.split("best", 1)[1])[:2]
    assert 0 < best <= median
    served = CliRunner().invoke(app, ["bench", "gateway", str(exports["minilm"]), "--http", "--requests", "200",
                                      "--concurrency", "4", "--log", str(tmp_path / "gateway.log")])
    assert served.exit_code == 0, served.output
    assert "us CPU per /embed request" in served.output and all(n > 0 for n in figures(served.output))
    assert (tmp_path / "gateway.log").read_text().count("POST /embed") >= 200
    over_grpc = CliRunner().invoke(app, ["bench", "gateway", str(exports["minilm"]), "--http", "--grpc", "--requests",
                                         "200", "--concurrency", "4", "--log", str(tmp_path / "grpc.log")])
    assert over_grpc.exit_code == 0, over_grpc.output
    assert "us CPU per Embed call" in over_grpc.output and all(n > 0 for n in figures(over_grpc.output))
    assert (tmp_path / "grpc.log").read_text().count("GRPC /tei.v1.Embed/Embed OK") >= 200


def test_bench_tracing_and_cache_compare_their_variants(exports):
    traced = CliRunner().invoke(app, ["bench", "tracing", str(exports["minilm"]), "--requests", "5"])
    assert traced.exit_code == 0, traced.output
    assert all(name in traced.output for name in ("off", "every request", "no request sampled"))
    cached = CliRunner().invoke(app, ["bench", "cache", str(exports["minilm"]), "--requests", "200",
                                      "--distinct", "20", "--rounds", "2", "--concurrency", "2", "--warmup", "2"])
    assert cached.exit_code == 0, cached.output
    executions = re.search(r"encoder executions\s+(\d+)\s+(\d+)", cached.output)
    assert executions and int(executions[2]) < int(executions[1])  # the cache answered repeats
    assert re.search(r"cache hit ratio\s+-\s+\d+\.\d%", cached.output)


def test_bench_late_weighs_per_token_answers_against_pooled_ones(tmp_path, minilm_dir):
    result = CliRunner().invoke(app, ["bench", "late", "--size", "tiny", "--requests", "6", "--batch", "4",
                                      "--concurrency", "2", "--work", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    ratios = dict(re.findall(r"(documents|queries), per-token / pooled: bytes x([\d.]+)", result.output))
    # a text's vectors, one per kept token, outweigh its one pooled vector many times over
    assert ratios.keys() == {"documents", "queries"} and all(float(x) > 5 for x in ratios.values()), result.output
    assert (tmp_path / "gateway.log").read_text().count("POST /embed_colbert") >= 2 * (6 + 1)
    refused = CliRunner().invoke(app, ["bench", "late", str(minilm_dir), "--work", str(tmp_path / "minilm")],
                                 env={"COLUMNS": "200"})
    assert refused.exit_code == 2 and "not a late-interaction" in refused.output, refused.output


@pytest.mark.parametrize("command", ["gateway", "tracing", "cache"])
def test_bench_measures_refuse_an_export_they_cannot_measure(command, exports):
    result = CliRunner().invoke(app, ["bench", command, str(exports["reranker"])], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "rerank" in result.output
