"""What Triton's response cache buys on repeated queries (`prensa bench cache`).

One export served twice, without and with the cache (`prensa repo build --response-cache`,
`prensa serve --cache-size`); both Tritons are sent the same stream, Zipf-distributed over
distinct short queries (rank k drawn with weight k^-s), by concurrent gRPC clients straight to the
ensemble, slice by slice in turn (see `compare`). Reports throughput, p50/p99 latency, the hit
ratio Triton counted (and the most a cold cache can reach on that stream) and the encoder's
executions side by side. The export must be an embedding or SPLADE model (the tasks
`--response-cache` caches).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from prensa.addresses import free_port
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import (
    CACHED_TASKS,
    ModelSource,
    Pipeline,
    ServingOptions,
    build_repository,
    cache_refusal,
    encoder_model,
)
from prensa.workload import zipf_queries

MODEL = "bench"


def text_input(text: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return tensor


@dataclass
class Served:
    """One Triton of the comparison: its clients and what it measured so far."""

    name: str
    triton: TritonProcess
    clients: list[grpcclient.InferenceServerClient] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    before: tuple[int, int, int] = (0, 0, 0)
    after: tuple[int, int, int] = (0, 0, 0)

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    @property
    def hits(self) -> int:
        return self.after[0] - self.before[0]

    @property
    def misses(self) -> int:
        return self.after[1] - self.before[1]

    @property
    def encoder_executions(self) -> int:
        return self.after[2] - self.before[2]


def counters(client: grpcclient.InferenceServerClient) -> tuple[int, int, int]:
    """(cache hits, cache misses, encoder executions) so far."""
    served = client.get_inference_statistics(MODEL).model_stats[0].inference_stats
    encoder = client.get_inference_statistics(encoder_model(MODEL, Pipeline.ENSEMBLE)).model_stats[
        0
    ]
    return served.cache_hit.count, served.cache_miss.count, encoder.execution_count


def send(
    client: grpcclient.InferenceServerClient,
    texts: list[str],
    latencies: list[float],
    errors: list[BaseException],
) -> None:
    try:
        for text in texts:
            started = time.perf_counter()
            client.infer(MODEL, [text_input(text)])
            latencies.append((time.perf_counter() - started) * 1000)
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(exc)


def send_round(served: Served, texts: list[str]) -> None:
    """`texts` from every client of `served` at once, dealt out in turn."""
    count = len(served.clients)
    shares: list[list[float]] = [[] for _ in range(count)]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=send, args=(client, texts[i::count], shares[i], errors))
        for i, client in enumerate(served.clients)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    served.wall_s += time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{served.name}: {errors[0]}") from errors[0]
    served.latencies_ms += [ms for share in shares for ms in share]


def start(name: str, repo: Path, cache_bytes: int, concurrency: int, warmup: int) -> Served:
    ports = TritonPorts(free_port(), free_port(), free_port())
    triton = TritonProcess(
        TritonOptions(repo, ports=ports, cache_bytes=cache_bytes),
        log_path=repo.parent / f"{name}.log",
    )
    triton.start()
    triton.wait_ready()
    served = Served(
        name,
        triton,
        [grpcclient.InferenceServerClient(triton.grpc_url) for _ in range(concurrency)],
    )
    for i in range(warmup):  # texts outside the stream: warm, without filling the cache with it
        served.clients[0].infer(MODEL, [text_input(f"warm-up query number {i}")])
    served.before = counters(served.clients[0])
    return served


def compare(served: list[Served], stream: list[str], rounds: int) -> None:
    """The stream in `rounds` slices, each sent to every Triton in turn, so that all of them meet the
    machine in the same state (other work on it, its clock) while the stream moves on."""
    size = -(-len(stream) // rounds)
    for start_at in range(0, len(stream), size):
        for one in served:
            send_round(one, stream[start_at : start_at + size])
    time.sleep(0.2)  # a model counts a request just after answering it
    for one in served:
        one.after = counters(one.clients[0])


def report(runs: list[Served], ideal_hit_ratio: float) -> str:
    """The runs side by side, one row per figure."""
    rows: list[tuple[str, Callable[[Served], str]]] = [
        ("requests", lambda r: f"{r.requests}"),
        ("throughput (req/s)", lambda r: f"{r.throughput:.1f}"),
        ("p50 latency (ms)", lambda r: f"{r.percentile(50):.2f}"),
        ("p99 latency (ms)", lambda r: f"{r.percentile(99):.2f}"),
        ("mean latency (ms)", lambda r: f"{statistics.fmean(r.latencies_ms):.2f}"),
        (
            "cache hit ratio",
            lambda r: f"{r.hits / (r.hits + r.misses):.1%}" if r.hits + r.misses else "-",
        ),
        ("encoder executions", lambda r: f"{r.encoder_executions}"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = ["".ljust(width) + "".join(r.name.rjust(14) for r in runs)]
    lines += [label.ljust(width) + "".join(cell(r).rjust(14) for r in runs) for label, cell in rows]
    lines.append(
        f"most a cold cache can hit on this stream (1 - distinct/requests): {ideal_hit_ratio:.1%}"
    )
    return "\n".join(lines)


CACHE_BYTES = 256 << 20  # the cached Triton's response cache


@dataclass(frozen=True)
class CacheRun:
    """What `prensa bench cache` sends: a stream of `requests` queries drawn from `distinct` ones."""

    export: Path
    requests: int = 20_000
    concurrency: int = 4
    distinct: int = 10_000
    zipf_s: float = 1.1
    cache_bytes: int = CACHE_BYTES
    warmup: int = 50
    rounds: int = 20
    seed: int = 0


def refusal(export: Path) -> str | None:
    """Why the export cannot be compared (a task whose answers prensa does not cache), or None."""
    if reason := cache_refusal(Manifest.read(export).task, ServingOptions().pipeline):
        return (
            f"{export}: {reason} (cached tasks: {', '.join(task.value for task in CACHED_TASKS)})"
        )
    return None


def run(options: CacheRun) -> tuple[list[Served], list[str]]:
    """Both Tritons after the stream, and the stream (`zipf_queries` refuses more distinct queries
    than its vocabulary makes, with ValueError)."""
    stream = zipf_queries(options.requests, options.seed, options.distinct, options.zipf_s)
    source = ModelSource(MODEL, options.export, Manifest.read(options.export))
    with tempfile.TemporaryDirectory(prefix="cache-bench-") as scratch, ExitStack() as stack:
        served = []
        for name, serving, cache_bytes in (
            ("uncached", ServingOptions(), 0),
            ("cached", ServingOptions(response_cache=True), options.cache_bytes),
        ):
            repo = Path(scratch) / name / "repo"
            build_repository([source], repo, serving)
            one = start(name, repo, cache_bytes, options.concurrency, options.warmup)
            stack.callback(one.triton.stop)
            served.append(one)
        compare(served, stream, options.rounds)
    return served, stream
