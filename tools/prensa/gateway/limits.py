"""Admission: permits per input (try-acquire, never queue) and per MiB of an answer being sent,
the rows each ensemble may have in Triton at once (`TritonWindow`), and how many client
connections the descriptor limit leaves room for (HTTP's and TEI gRPC's caps). The HTTP checks
before them (API key, JSON body, size) are in `middleware`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from prensa.gateway.errors import overloaded

T = TypeVar("T")
log = logging.getLogger("prensa.gateway")
# Descriptors kept for the gateway itself (Triton channels, log files, the listening socket, ...).
RESERVED_FDS = 64
UNLIMITED_FDS = 65_536  # the ceiling assumed where RLIMIT_NOFILE is unlimited


class SharedPermits:
    """The permits every worker of a gateway holds (`--workers`), one slot per worker in shared
    memory, so that --max-concurrent-requests bounds them all together; a worker that dies has its
    slot emptied by the supervisor before it is replaced."""

    def __init__(self, counts: Any, slot: int) -> None:
        self.counts = counts  # multiprocessing.Array("q", workers): its lock guards every slot
        self.slot = slot

    def take(self, count: int, capacity: int) -> bool:
        """Add `count` to this worker's slot if all slots together stay within `capacity`."""
        with self.counts.get_lock():
            slots = self.counts.get_obj()
            if sum(slots) + count > capacity:
                return False
            slots[self.slot] += count
            return True

    def add(self, count: int) -> None:
        with self.counts.get_lock():
            self.counts.get_obj()[self.slot] += count


class Permits:
    """A try-acquire counting semaphore: asyncio runs one handler at a time, so no lock is needed
    within a process; across a gateway's workers `shared` holds the count (`SharedPermits`)."""

    def __init__(
        self, capacity: int, on_change: Callable[[int], None], shared: SharedPermits | None = None
    ) -> None:
        self.capacity = capacity
        self.in_use = 0  # this process's
        self._on_change = on_change
        self._shared = shared

    @contextmanager
    def hold(self, count: int) -> Iterator[None]:
        """Take `count` permits for the duration of the block, or raise Overloaded at once."""
        if self._shared is None:
            if self.in_use + count > self.capacity:
                raise overloaded()
        elif not self._shared.take(count, self.capacity):
            raise overloaded()
        with self._held(count):
            yield

    @contextmanager
    def charge(self, count: int) -> Iterator[None]:
        """Take `count` permits for the duration of the block even past the capacity: for work
        already admitted (an answer being sent): later requests get 429 while it lasts."""
        if self._shared is not None:
            self._shared.add(count)
        with self._held(count):
            yield

    @contextmanager
    def _held(self, count: int) -> Iterator[None]:
        """Count `count` permits (already taken) until the block ends, then give them back."""
        self.in_use += count
        self._on_change(self.in_use)
        try:
            yield
        finally:
            self.in_use -= count
            if self._shared is not None:
                self._shared.add(-count)
            self._on_change(self.in_use)


class TritonWindow:
    """The rows one ensemble has in Triton, at most `capacity`; calls beyond it wait here, first come
    first served, and a call whose client hangs up while it waits leaves without reaching Triton.

    Triton cancels an ensemble step only when it creates it: a client that hangs up cancels
    its ensemble request, but the encode step already queued is computed all the same (the
    Python stage sees it as not cancelled). So the gateway keeps that queue short: rows stay
    counted until Triton answers, even for a client that is gone (its call runs on, its answer is
    dropped), and what a storm of hang-ups leaves Triton to compute is at most `capacity` rows.
    A call of more rows than `capacity` waits for an empty window and runs alone."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self.in_triton = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        # the event loop keeps only weak references to tasks
        self._calls: set[asyncio.Future[Any]] = set()

    async def run(self, rows: int, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` once `rows` fit; it finishes even if the caller is cancelled meanwhile."""
        rows = min(rows, self.capacity)
        if self._waiting or self.in_triton + rows > self.capacity:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append((rows, turn))
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # admitted just before the cancellation
                    self._release(rows)
                else:
                    with suppress(ValueError):
                        self._waiting.remove((rows, turn))
                    self._admit()  # it may have held back smaller calls behind it
                raise
        else:
            self.in_triton += rows
        task = asyncio.ensure_future(call())
        self._calls.add(task)
        task.add_done_callback(lambda done: self._finished(done, rows))
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Future[T], rows: int) -> None:
        self._calls.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: nobody awaits the call of a client that is gone
        self._release(rows)

    def _release(self, rows: int) -> None:
        self.in_triton -= rows
        self._admit()

    def _admit(self) -> None:
        while self._waiting:
            rows, turn = self._waiting[0]
            if not turn.cancelled() and self.in_triton + rows > self.capacity:
                return
            self._waiting.popleft()
            if not turn.cancelled():  # a cancelled caller is leaving: it takes nothing
                self.in_triton += rows
                turn.set_result(None)


def connection_ceiling() -> int:
    """The most client connections the process's file-descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = UNLIMITED_FDS if soft == resource.RLIM_INFINITY else soft
    return max(limit - RESERVED_FDS, 1)


def connection_cap(requested: int | None) -> int:
    """`--max-connections`, or the ceiling when unset or above it (a cap above the descriptor
    limit would let accept() fail before the cap refuses anyone)."""
    ceiling = connection_ceiling()
    if requested is not None and requested > ceiling:
        log.warning(
            "--max-connections %d is above what the file-descriptor limit (ulimit -n) allows; using %d",
            requested,
            ceiling,
        )
    return ceiling if requested is None else min(requested, ceiling)
