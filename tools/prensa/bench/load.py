"""Closed-loop load: N concurrent clients, each sending its next request when the last returns.

This is how online embedding traffic looks to a server (many small requests in flight); the
figures are throughput over the whole run and the latency distribution of single requests, with
the CPU the servers spent per request (their processes and children, e.g. Triton's Python stubs)
and the cores the load generator itself used, so a reader can tell whether it held the ratio back.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import psutil

Item = TypeVar("Item")


@dataclass
class LoadResult:
    concurrency: int
    seconds: float
    sequences: int
    tokens: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    server_cpu_s: float | None = None  # CPU of the watched server processes during the run
    client_cpu_s: float = 0.0  # this process's own CPU during the run

    def figures(self) -> dict[str, float]:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        return {
            "concurrency": self.concurrency,
            "seq_per_s": self.sequences / self.seconds if self.seconds else 0.0,
            "tok_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "p50_ms": float(np.percentile(lat, 50)),
            "p90_ms": float(np.percentile(lat, 90)),
            "p99_ms": float(np.percentile(lat, 99)),
            "errors": self.errors,
            **(
                {"server_cpu_ms_per_request": self.server_cpu_s * 1000 / self.requests}
                if self.server_cpu_s is not None and self.requests
                else {}
            ),
            "client_cpu_cores": self.client_cpu_s / self.seconds if self.seconds else 0.0,
        }


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU of these processes and all their children, so far."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            for each in (process, *process.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    times = each.cpu_times()
                    total += times.user + times.system
    return total


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Workload(Generic[Item]):
    """Requests to send, with the sequences and tokens each one carries."""

    items: Sequence[Item]
    sequences: Sequence[int]
    tokens: Sequence[int]


async def closed_loop(
    send: Callable[[Item], Awaitable[None]],
    workload: Workload[Item],
    concurrency: int,
    servers: Sequence[int] = (),
) -> LoadResult:
    """Every item of `workload` sent by `concurrency` clients; `servers` are the pids whose CPU counts."""
    next_index = 0
    result = LoadResult(concurrency, 0.0, 0, 0)

    async def client() -> None:
        nonlocal next_index
        while next_index < len(workload.items):
            index = next_index
            next_index += 1
            started = time.perf_counter()
            try:
                await send(workload.items[index])
            except Exception:  # noqa: BLE001 - counted; a benchmark reports failures, it does not stop
                result.errors += 1
                continue
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            result.sequences += workload.sequences[index]
            result.tokens += workload.tokens[index]
            result.requests += 1

    server_cpu, own_cpu = cpu_seconds(servers), own_cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - started
    result.client_cpu_s = own_cpu_seconds() - own_cpu
    if servers:
        result.server_cpu_s = cpu_seconds(servers) - server_cpu
    return result
