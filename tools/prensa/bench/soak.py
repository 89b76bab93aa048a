"""Soak: a prensa of its own under steady mixed load, every process's memory watched
(`prensa loadtest soak`).

`prensa up` (Triton and the gateway) runs on free loopback ports; clients send OpenAI embeddings,
sparse embeddings and reranking requests while the RSS of the prensa process (it hosts the
gateway), tritonserver and each Python backend stub is sampled. A warm-up of the largest requests,
all clients at once, comes first, so memory arenas reach their peak before sampling starts. The
verdict passes when no process grows steadily (see `Trend`) and no request got a 5xx or failed
to connect. `prensa loadtest heal` reuses the server and the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import itertools
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from prensa import layouts
from prensa.addresses import free_port, http_url
from prensa.layouts import Layout, Scoring
from prensa.manifest import Task
from prensa.stages import contract

PRENSA = Path(sys.executable).parent / "prensa"
WORDS = [
    "river",
    "bridge",
    "city",
    "museum",
    "night",
    "train",
    "harbour",
    "market",
    "winter",
    "garden",
    "library",
    "question",
    "answer",
    "embedding",
    "vector",
    "search",
    "ranking",
    "passage",
    "query",
    "model",
    "server",
    "memory",
    "latency",
    "batch",
    "token",
]


def label(process: psutil.Process, root: int) -> str:
    """`prensa (gateway)`, `tritonserver`, or the model a Python backend stub serves."""
    if process.pid == root:
        return "prensa (gateway)"
    if process.name() == "tritonserver":
        return "tritonserver"
    model = next(
        (Path(arg).parent.parent.name for arg in process.cmdline() if arg.endswith("model.py")),
        None,
    )
    return f"stub {model}" if model else f"{process.name()} {process.pid}"


class MemorySampler(threading.Thread):
    """RSS of the root process and all its descendants, every `every_s` seconds, into `rows`."""

    def __init__(self, root: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        # seconds since start, label, pid, RSS MB
        self.rows: list[tuple[float, str, int, float]] = []
        self.labels: dict[int, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            try:
                top = psutil.Process(self.root)
                processes = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            now = time.monotonic() - started
            for process in processes:
                try:
                    # a pid's label is fixed
                    name = self.labels.setdefault(process.pid, label(process, self.root))
                    self.rows.append((now, name, process.pid, process.memory_info().rss / 2**20))
                except psutil.NoSuchProcess:
                    continue
            self.stop.wait(self.every_s)


@dataclass
class Load:
    """Per request kind: how many got each status (or transport error), and their seconds."""

    statuses: dict[str, Counter[int | str]] = field(default_factory=lambda: defaultdict(Counter))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


MAX_TEXTS, MAX_WORDS = 8, 120  # per request; warm-up sends this largest shape


def texts(rng: random.Random, largest: bool, count: int = MAX_TEXTS) -> list[str]:
    """`count` texts (fewer, at random, unless `largest`) of up to MAX_WORDS words."""
    n = count if largest else rng.randint(1, count)
    return [
        " ".join(
            rng.choice(WORDS) for _ in range(MAX_WORDS if largest else rng.randint(3, MAX_WORDS))
        )
        for _ in range(n)
    ]


Body = Callable[[random.Random, bool], dict[str, Any]]
Kind = tuple[str, str, Body]  # (kind, route, body(rng, largest))


def first_model(info: dict[str, Any], fits: Callable[[Layout], bool]) -> str | None:
    """The first model `/info` lists whose layout fits."""
    return next(
        (
            model["served_model_name"]
            for model in info["models"]
            if fits(layouts.resolve(Task(model["task"])))
        ),
        None,
    )


def answers_dense(kind: Layout) -> bool:
    return contract.DENSE in kind.answers


def requests_for(info: dict[str, Any]) -> list[Kind]:
    """(kind, route, body(rng, largest)) for what the served models can do."""
    embed = first_model(info, answers_dense)
    sparse = first_model(info, lambda kind: contract.SPARSE_IDS in kind.answers)
    rerank = first_model(info, lambda kind: kind.scoring is Scoring.PAIRS)
    kinds: list[Kind] = []
    if embed:
        kinds.append(
            (
                "embeddings",
                "/v1/embeddings",
                lambda rng, big: {"model": embed, "input": texts(rng, big)},
            )
        )
    if sparse:
        kinds.append(
            (
                "sparse",
                f"/embed_sparse?model={sparse}",
                lambda rng, big: {"inputs": texts(rng, big)},
            )
        )
    if rerank:
        kinds.append(
            (
                "rerank",
                f"/rerank?model={rerank}",
                lambda rng, big: {"query": texts(rng, big, 1)[0], "texts": texts(rng, big)},
            )
        )
    return kinds


async def warm_up(url: str, kinds: list[Kind], concurrency: int) -> None:
    """The largest requests the load will send, all clients at once, per kind: onnxruntime's memory
    arenas grow to their peak here, before sampling, and do not pass for a leak later."""
    rng = random.Random(0)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for _, route, body in kinds:
            sent = [client.post(route, json=body(rng, True)) for _ in range(concurrency)]
            for response in await asyncio.gather(*sent):
                response.raise_for_status()


async def drive(url: str, kinds: list[Kind], seconds: float, concurrency: int, load: Load) -> None:
    """`concurrency` clients send the kinds in turn until `seconds` have passed, counted in `load`."""
    deadline = time.monotonic() + seconds
    cycle = itertools.cycle(kinds)

    async def client_loop(index: int) -> None:
        rng = random.Random(index)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while time.monotonic() < deadline:
                kind, route, body = next(cycle)
                sent = time.perf_counter()
                status: int | str
                try:
                    status = (await client.post(route, json=body(rng, False))).status_code
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                load.statuses[kind][status] += 1
                load.latencies[kind].append(time.perf_counter() - sent)

    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))


@dataclass(frozen=True)
class Trend:
    """Second half of one process's samples (the first half is warm-up)."""

    slope: float  # MB/min, least squares
    rising: float  # share of sampling intervals in which RSS rose by more than RISE_MB

    def verdict(self, max_slope: float) -> str:
        """`GROWING` only for steady growth: too steep and rising in most intervals. Steep but rising
        in few intervals is `steps`: an allocator (onnxruntime's arena) reserving more for a larger
        batch shape than seen before, which plateaus; it is shown, not failed."""
        if not self.slope > max_slope:
            return "ok"
        return "GROWING" if self.rising > 0.5 else "steps"


RISE_MB = 0.1


def trend(points: list[tuple[float, float]]) -> Trend:
    """The trend of the second half of (seconds, RSS MB) samples."""
    half = points[len(points) // 2 :]
    if len(half) < 3:
        return Trend(float("nan"), 0.0)
    seconds, rss = np.array(half).T
    return Trend(
        float(np.polyfit(seconds / 60.0, rss, 1)[0]), float(np.mean(np.diff(rss) > RISE_MB))
    )


def memory_report(
    rows: list[tuple[float, str, int, float]], max_slope: float
) -> tuple[list[str], bool]:
    """One line per process (start, end, peak, trend, verdict), and whether none grew steadily."""
    by_process: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for now, name, pid, rss in rows:
        by_process[(name, pid)].append((now, rss))
    lines = [
        f"memory (RSS MB; second half: least-squares slope, share of {RISE_MB:g} MB rises; "
        f"threshold {max_slope:g} MB/min)",
        f"{'process':<36} {'pid':>7} {'start':>8} {'end':>8} {'peak':>8} {'MB/min':>8} {'rising':>7}  verdict",
    ]
    memory_ok = True
    for (name, pid), points in sorted(by_process.items()):
        found = trend(points)
        verdict = found.verdict(max_slope)
        memory_ok &= verdict != "GROWING"
        sizes = [size for _, size in points]
        lines.append(
            f"{name:<36} {pid:>7} {sizes[0]:>8.1f} {sizes[-1]:>8.1f} {max(sizes):>8.1f} {found.slope:>8.2f} "
            f"{found.rising:>7.0%}  {verdict}"
        )
    return lines, memory_ok


def load_report(load: Load, minutes: float) -> tuple[list[str], int]:
    """One line per request kind (statuses, rate, latency), and the server errors and failed connections."""
    lines, errors = ["requests (status: count; latency ms p50/p99)"], 0
    for kind, statuses in sorted(load.statuses.items()):
        latencies = np.array(load.latencies[kind]) * 1000
        total = sum(statuses.values())
        errors += sum(
            n for status, n in statuses.items() if not isinstance(status, int) or status >= 500
        )
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items(), key=str))
        lines.append(
            f"{kind:<11} {total:>7} requests ({total / (minutes * 60):.1f}/s)  {counts}  "
            f"p50 {np.percentile(latencies, 50):.0f}  p99 {np.percentile(latencies, 99):.0f}"
        )
    return lines, errors


def report(
    sampler: MemorySampler, load: Load, minutes: float, max_slope: float
) -> tuple[list[str], bool]:
    """The memory and request tables and the verdict, as lines, and whether it passed."""
    memory, memory_ok = memory_report(sampler.rows, max_slope)
    requests, errors = load_report(load, minutes)
    passed = memory_ok and errors == 0
    verdict = (
        f"verdict: {'PASS' if passed else 'FAIL'} (memory {'without' if memory_ok else 'with'} steady "
        f"growth, {errors} server errors or failed connections)"
    )
    return [*memory, "", *requests, "", verdict], passed


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(1)
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM prensa (it drains Triton), SIGKILL by PID whatever is left of its tree."""
    children = (
        psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
    )
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def start_prensa(
    work: Path, models: list[str] | None, log: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """`prensa up` on free loopback ports, its exports and repository kept in `work`, its output in
    `log`: the process and the gateway's URL."""
    work.mkdir(parents=True, exist_ok=True)
    ports = [str(free_port()) for _ in range(4)]
    command = [
        str(PRENSA),
        "up",
        "--models-dir",
        str(work / "models"),
        "--repo",
        str(work / "model_repo"),
        "--http-port",
        ports[0],
        "--grpc-port",
        ports[1],
        "--metrics-port",
        ports[2],
        "--gateway-port",
        ports[3],
        *extra,
    ]
    for model in models or ():
        command += ["--model", model]
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT), http_url(
            int(ports[3])
        )


def write_samples(sampler: MemorySampler, path: Path) -> None:
    """Every RSS sample as CSV: seconds, process, pid, rss_mb."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seconds", "process", "pid", "rss_mb"])
        writer.writerows(
            (f"{now:.1f}", name, pid, f"{rss:.2f}") for now, name, pid, rss in sampler.rows
        )


@dataclass(frozen=True)
class SoakRun:
    """What `prensa loadtest soak` runs: `prensa up` in `work`, `concurrency` clients for `minutes`."""

    work: Path
    models: tuple[str, ...] = ()
    minutes: float = 10.0
    concurrency: int = 8
    sample_every_s: float = 3.0
    max_slope: float = 2.0


class NotServing(RuntimeError):
    """prensa did not become healthy; its log says why."""


@contextlib.contextmanager
def serving_prensa(
    work: Path,
    models: tuple[str, ...],
    log: Path,
    say: Callable[[str], None],
    up_flags: tuple[str, ...] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`prensa up` healthy (`start_prensa`): its process and the gateway's URL, stopped afterwards."""
    process, url = start_prensa(work, list(models), log, up_flags)
    try:
        say(f"starting prensa (log: {log}) ...")
        if not wait_healthy(url, process, timeout_s=1800):
            raise NotServing(f"prensa did not become healthy; see {log}")
        yield process, url
    finally:
        stop(process)


def run_soak(run: SoakRun, say: Callable[[str], None]) -> tuple[list[str], bool]:
    """Serve, warm up, load while sampling, stop; the report and whether it passed (the samples are
    written to `<work>/soak-memory.csv`)."""
    with serving_prensa(run.work, run.models, run.work / "prensa.log", say) as (process, url):
        kinds = requests_for(httpx.get(f"{url}/info").json())
        asyncio.run(warm_up(url, kinds, run.concurrency))
        say(
            f"soaking {url} for {run.minutes:g} min with {run.concurrency} clients: "
            f"{', '.join(kind for kind, _, _ in kinds)}"
        )
        sampler = MemorySampler(process.pid, run.sample_every_s)
        sampler.start()
        load = Load()
        asyncio.run(drive(url, kinds, run.minutes * 60, run.concurrency, load))
        sampler.stop.set()
        sampler.join()
    write_samples(sampler, run.work / "soak-memory.csv")
    say(f"samples: {run.work / 'soak-memory.csv'}")
    return report(sampler, load, run.minutes, run.max_slope)
