"""tools/gpu_check.py --bench runs its whole path on the CPU with the tiny models (`--dry-run`):
building the models, the raw engine and its share of the peak, the lone query, the rerank, the
accuracy gate and serving through Triton and the gateway; and what a CPU machine lacks for the
GPU run is reported, not faked."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prensa.export import synthetic

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.triton
def test_dry_run_measures_every_part_and_serves_through_prensa(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--serve", "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OUT": str(out)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_bench.json").read_text())
    assert report["failures"] == []
    assert report["machine"]["plan"]["size"] == "tiny" and report["machine"]["plan"]["device"] == "cpu"

    config = synthetic.xlmr_config("tiny", 1)
    assert report["models"]["bge-m3"]["parameters"] == synthetic.parameter_count(
        synthetic.bge_m3_config("tiny", report_vocab(tmp_path)), "bge-m3")
    for length in (128, 512):
        runs = {k: v for k, v in report["raw_engine"].items() if k.startswith(f"{length} tokens x")}
        assert runs
        for figures in runs.values():  # the share is the throughput's FLOPs over 989 TFLOP/s
            want = figures["seq_per_s"] * length * synthetic.flops_per_token(config, length) / 989e12
            assert figures["share_of_peak"] == pytest.approx(want, rel=0.01) and want > 0
        assert report["raw_engine"][f"{length} tokens best"]["meets_target"] is False  # tiny on a CPU: far from it

    gate = next(g for g in report["accuracy"] if g["model"] == "bge-m3")
    assert gate["ok"] and gate["min_token_cosine"] >= 0.999
    assert report["rerank"]["pairs"] == 100 and report["rerank"]["tokens_per_pair"] == 256
    assert 0 < report["lone_query"]["p50_ms"] <= report["lone_query"]["p90_ms"]

    serving = report["serving"]
    assert serving["gateway"] == "measured"
    for length in (128, 512):
        measured = serving[f"bge-m3 {length} tokens"]
        assert 0.85 * length <= measured["mean_tokens"] <= length
        assert {s["name"] for s in measured["systems"]} == {"prensa (Triton gRPC)", "prensa (gateway HTTP)"}
        for system in measured["systems"]:
            assert [r["concurrency"] for r in system["runs"]] == [1, 2, 4]
            assert all(r["errors"] == 0 and r["seq_per_s"] > 0 and r["share_of_peak"] > 0 for r in system["runs"])
    mix = serving["bge-m3 realistic mix"]  # token lengths drawn as the GPU mixes draw them
    assert all(r["errors"] == 0 and r["seq_per_s"] > 0 for s in mix["systems"] for r in s["runs"])
    engine = report["engine_on_mixes"]  # on the CPU the stage falls back to its CPU rule
    assert engine["provider"] == "CPUExecutionProvider" and not engine["packed_graph"]
    for name in ("realistic", "queries", "passages", "half"):
        assert engine[name]["stage_seq_per_s"] > 0 and engine[name]["computed_per_real_token"] >= 1
    rerank = serving["rerank 100 passages"]
    assert rerank["encoder"]["average_batch"] == 100  # all pairs of a request in one execute
    assert all(s["p50_ms_100_pairs"] > 0 and s["runs"][0]["errors"] == 0 for s in rerank["systems"])


def report_vocab(tmp_path: Path) -> int:
    return json.loads((tmp_path / "work" / "bge-m3-tiny" / "config.json").read_text())["vocab_size"]


def test_gpu_run_without_a_gpu_says_what_is_missing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--bench", "--work", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    check = gpu_check_module()
    if check.missing_cuda() is None:
        pytest.skip("this machine has a CUDA GPU: the full run applies")
    assert done.returncode == 2 and "cannot run the GPU benchmark: missing a CUDA GPU" in done.stdout
    assert not (tmp_path / "gpu_bench.json").exists()


def test_serving_on_cuda_without_onnxruntime_gpu_is_skipped_with_the_reason():
    check = gpu_check_module()
    import onnxruntime as ort

    plan = check.BenchPlan(**{**check.FULL_PLAN.__dict__})
    missing = check.serving_missing(plan)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert not any("CUDAExecutionProvider" in reason for reason in missing)
    else:
        assert any("no CUDAExecutionProvider" in reason and "onnxruntime-gpu" in reason for reason in missing)
    assert check.serve_through_prensa(check.DRY_PLAN, Path("/nonexistent"), Path("/nonexistent"), {}) == {
        "skipped": ["not asked for: --serve starts Triton (and the gateway) on these models"]}
