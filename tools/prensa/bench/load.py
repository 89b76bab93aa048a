"""Closed-loop load: N concurrent clients, each sending its next request when the last returns.

This is how online embedding traffic looks to a server (many small requests in flight); the
figures are throughput over the whole run and the latency distribution of single requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

Item = TypeVar("Item")


@dataclass
class LoadResult:
    concurrency: int
    seconds: float
    sequences: int
    tokens: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

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
        }


@dataclass(frozen=True)
class Workload(Generic[Item]):
    """Requests to send, with the sequences and tokens each one carries."""

    items: Sequence[Item]
    sequences: Sequence[int]
    tokens: Sequence[int]


async def closed_loop(send: Callable[[Item], Awaitable[None]], workload: Workload[Item], concurrency: int) -> LoadResult:
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

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - started
    return result
