"""Model changes under load (`prensa bench changes`).

One Triton and one gateway with `--model-admin` serve an embedding export while clients embed
short texts without pause. Meanwhile the export is added again as the model's second version,
promoted, rolled back and removed, with steady spells between. Every answer is kept with when it
was asked and which version answered it, so each change gets its latency before, during and after,
its failed requests, and its answers from a version that should not have answered: one asked
after a promotion returned from the version before it, or one that ended before it began from
the version after (among the answers that overlap no other change: a request asked before a
change may reach the gateway after it).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from prensa.addresses import free_port
from prensa.bench.systems import ServerProcess, gateway_server
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.versions import pin
from prensa.workload import query_texts

# How long after a change its requests still count as "during": the change's own wake.
WAKE_S = 1.0
TEXTS_PER_CLIENT = 500  # distinct texts each client cycles through (no cache here to hit)


@dataclass(frozen=True)
class Answer:
    started: float
    ended: float
    status: int
    version: str  # the x-prensa-model-version header ("" on a failure)


@dataclass(frozen=True)
class Change:
    """One change: its name, when it was asked and when it returned, and which version the name
    reaches before and after it."""

    name: str
    began: float
    returned: float
    before: str
    after: str


@dataclass(frozen=True)
class ChangeFigures:
    name: str
    seconds: float
    p99_before_ms: float
    p99_during_ms: float
    p99_after_ms: float
    failed: int
    wrong_version: int


class Load:
    """`clients` concurrent clients, each embedding one short text at a time without pause."""

    def __init__(self, base_url: str, model: str, clients: int) -> None:
        self.base_url, self.model, self.clients = base_url, model, clients
        self.answers: list[Answer] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(self._client(client, seed) for seed in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, seed: int) -> None:
        texts = itertools.cycle(query_texts(TEXTS_PER_CLIENT, seed=seed))
        while not self.stop.is_set():
            body = {"model": self.model, "input": next(texts)}
            started = time.perf_counter()
            try:
                response = await client.post("/v1/embeddings", json=body)
                status, version = (
                    response.status_code,
                    response.headers.get("x-prensa-model-version", ""),
                )
            except httpx.HTTPError:
                status, version = 0, ""
            self.answers.append(Answer(started, time.perf_counter(), status, version))

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(180)


def p99_ms(answers: list[Answer]) -> float:
    times = [(a.ended - a.started) * 1000 for a in answers if a.status == 200]
    return float(np.percentile(times, 99)) if times else float("nan")


def figures(change: Change, answers: list[Answer], steady_s: float) -> ChangeFigures:
    """`change`'s figures from the answers around it: before is the steady spell before it,
    during its span and WAKE_S after, after the steady spell that follows."""
    end = change.returned + WAKE_S
    before = [a for a in answers if change.began - steady_s <= a.started < change.began]
    during = [a for a in answers if change.began <= a.started < end]
    after = [a for a in answers if end <= a.started < end + steady_s]
    # answers within this change's spells, none overlapping the changes before and after it
    settled = [
        a
        for a in answers
        if a.status == 200 and change.began - steady_s <= a.started and a.ended < end + steady_s
    ]
    wrong = [
        a
        for a in settled
        if (a.started > change.returned and a.version != change.after)
        or (a.ended < change.began and a.version != change.before)
    ]
    return ChangeFigures(
        change.name,
        change.returned - change.began,
        p99_ms(before),
        p99_ms(during),
        p99_ms(after),
        sum(a.status != 200 for a in (*before, *during, *after)),
        len(wrong),
    )


@contextmanager
def serving(repo: Path, work: Path) -> Iterator[str]:
    """Triton and a gateway with --model-admin on `repo`: the gateway's URL."""
    ports = TritonPorts(free_port(), free_port(), free_port())
    triton = TritonProcess(TritonOptions(repo=repo, ports=ports), log_path=work / "triton.log")
    triton.start()
    try:
        triton.wait_ready()
        gateway: ServerProcess = gateway_server(
            triton.grpc_url, repo, free_port(), work / "gateway.log", extra=["--model-admin"]
        )
        gateway.start()
        try:
            yield gateway.base_url
        finally:
            gateway.stop()
    finally:
        triton.stop()


def measure(
    repo: Path,
    model: str,
    export_dir: Path,
    clients: int,
    steady_s: float,
    say: Callable[[str], None],
) -> tuple[list[ChangeFigures], int]:
    """Each change's figures, and how many requests were answered in all."""
    with tempfile.TemporaryDirectory(prefix="prensa-changes-") as scratch:
        work = Path(scratch)
        with serving(repo, work) as url, httpx.Client(base_url=url, timeout=900) as admin:

            def change(name: str, method: str, path: str, body: object, moves: str) -> Change:
                say(f"{name}, under {clients} clients")
                began = time.perf_counter()
                response = admin.request(method, path, json=body)
                returned = time.perf_counter()
                if response.status_code != 200:
                    raise RuntimeError(f"{name}: HTTP {response.status_code} {response.text}")
                before, after = moves.partition(">")[::2]
                time.sleep(WAKE_S + steady_s)
                return Change(name, began, returned, before, after)

            added = {"name": model, "export_dir": str(export_dir.resolve())}
            promotion = {"version": 2}
            with Load(url, model, clients) as load:
                time.sleep(steady_s)
                changes = [
                    change(f"add {pin(model, 2)}", "POST", "/admin/models", added, "1>1"),
                    change(
                        f"promote {pin(model, 2)}",
                        "POST",
                        f"/admin/models/{model}/promote",
                        promotion,
                        "1>2",
                    ),
                    change(
                        f"roll back {model}", "POST", f"/admin/models/{model}/rollback", {}, "2>1"
                    ),
                    change(
                        f"remove {pin(model, 2)}",
                        "DELETE",
                        f"/admin/models/{pin(model, 2)}",
                        None,
                        "1>1",
                    ),
                ]
            answers = sorted(load.answers, key=lambda a: a.started)
    return [figures(one, answers, steady_s) for one in changes], len(answers)


def summary(rows: list[ChangeFigures]) -> str:
    """One line: the worst p99 during a change over its p99 before, the median of those."""
    ratios = [row.p99_during_ms / row.p99_before_ms for row in rows if row.p99_before_ms]
    return f"p99 during / before: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}"
