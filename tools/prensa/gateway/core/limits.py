"""Admission: permits per input (try-acquire, never queue) and per MiB of an answer being sent,
the rows each ensemble may have in Triton at once (`TritonWindow`), and how many client
connections the descriptor limit leaves room for (HTTP's and TEI gRPC's caps). The HTTP checks
before them (API key, JSON body, size) are in `middleware`.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import resource
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from prensa.gateway.core.request_context import Priority
from prensa.gateway.core.turns import Turns
from prensa.gateway.errors import overloaded, queue_time_passed

T = TypeVar("T")
log = logging.getLogger("prensa.gateway")
# The share of the permits bulk work may hold: the rest stays free for online requests.
BULK_SHARE = 0.75
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

    def take(self, count: int, fits: Callable[[int, int], bool]) -> bool:
        """Add `count` to this worker's slot if `fits(held, count)`, `held` all slots together."""
        with self.counts.get_lock():
            slots = self.counts.get_obj()
            if not fits(sum(slots), count):
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
        self,
        capacity: int,
        on_change: Callable[[int], None],
        shared: SharedPermits | None = None,
        bulk_share: float = 1.0,
    ) -> None:
        """`bulk_share`: the share of `capacity` bulk work may hold (BULK_SHARE with priority on)."""
        self.capacity = capacity
        self.bulk_capacity = max(int(capacity * bulk_share), 1)
        self.in_use = 0  # this process's
        self._on_change = on_change
        self._shared = shared

    @contextmanager
    def hold(self, count: int, priority: Priority = Priority.ONLINE) -> Iterator[None]:
        """Take `count` permits for the duration of the block, or raise Overloaded at once; bulk
        work finds them gone past its share, so a flood of it leaves online requests room."""
        fits = self._fits if priority is Priority.ONLINE else self._fits_bulk
        if self._shared is None:
            if not fits(self.in_use, count):
                raise overloaded()
        elif not self._shared.take(count, fits):
            raise overloaded()
        with self._held(count):
            yield

    def _fits(self, held: int, count: int) -> bool:
        return held + count <= self.capacity

    def _fits_bulk(self, held: int, count: int) -> bool:
        """Within the bulk share; a bulk request larger than the share goes when nothing else
        holds permits (else it could never go), up to the whole capacity."""
        return held + min(count, self.bulk_capacity) <= self.bulk_capacity and self._fits(
            held, count
        )

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


class UnsentAnswers:
    """Bytes of answers this process holds for clients that have not read them yet, at most
    `capacity`: an answer is held whole until its last piece is written, however slowly its client
    reads, so a few clients that never read would otherwise hold any amount of memory."""

    def __init__(self, capacity: int, on_change: Callable[[int], None] = lambda _: None) -> None:
        self.capacity = capacity
        self.held = 0
        self._on_change = on_change

    @property
    def full(self) -> bool:
        return self.held >= self.capacity

    @contextmanager
    def hold(self, size: int) -> Iterator[bool]:
        """True (and `size` bytes counted for the block) if they fit, else False and nothing counted."""
        if self.held + size > self.capacity:
            yield False
            return
        self.held += size
        self._on_change(self.held)
        try:
            yield True
        finally:
            self.held -= size
            self._on_change(self.held)


# A trim runs this long after the last large answer ended (the ends of a burst of them, and the
# frees that follow an end, served by one trim), and at most this long after the first.
TRIM_DELAY_S, TRIM_MAX_DELAY_S = 0.5, 5.0


class MemoryTrim:
    """Hands the memory of large answers back to the system once they are gone. An answer dropped
    with its client leaves through an exception whose traceback holds the frames, and so the body,
    in a reference cycle that only a full collection finds (a 37 MB body counts as one object
    toward the collector's thresholds); and glibc keeps freed heap pages for reuse, so a process
    that held 300 MB of unread answers would stay that large. So a trim collects cycles, then
    trims the heap, TRIM_DELAY_S after the last ask (at most TRIM_MAX_DELAY_S after the first): each
    walks the whole heap. Where libc is not glibc, only the collection runs."""

    def __init__(self) -> None:
        self.pending: asyncio.TimerHandle | None = None
        self.first = 0.0

    def ask(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.pending is None:
            self.first = now
        else:
            self.pending.cancel()
        delay = min(TRIM_DELAY_S, max(self.first + TRIM_MAX_DELAY_S - now, 0.0))
        self.pending = loop.call_later(delay, self._trim)

    def _trim(self) -> None:
        self.pending = None
        gc.collect()
        if (libc := _libc()) is not None:
            libc.malloc_trim(0)


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): its allocator returns memory its own way
        return None


class TritonWindow:
    """The rows one ensemble has in Triton, at most `capacity`; calls beyond it wait here, online
    calls before bulk ones and, within a priority, in turn by client (`Turns`); a call whose client
    hangs up while it waits leaves without reaching Triton.

    Triton cancels an ensemble step only when it creates it: a client that hangs up cancels its
    ensemble request, but the encode step already queued is computed all the same (the Python stage
    sees it as not cancelled). So the gateway keeps that queue short: rows stay counted until Triton
    answers, even for a client that is gone (its call runs on, its answer is dropped), and what a
    storm of hang-ups leaves Triton to compute is at most `capacity` rows. Bulk calls hold at most
    `bulk_capacity` rows, the rest kept for online ones (Triton passes no priority to an ensemble's
    steps, so the gateway's window is where it holds). A call of more rows than its limit waits for
    an empty window and runs alone. A call that waits longer than `max_wait_s` (--max-queue-time)
    leaves overloaded (429, RESOURCE_EXHAUSTED)."""

    def __init__(
        self, capacity: int, max_wait_s: float | None = None, bulk_capacity: int | None = None
    ) -> None:
        self.capacity = max(capacity, 1)
        self.limits = {
            Priority.ONLINE: self.capacity,
            Priority.BULK: min(max(bulk_capacity or self.capacity, 1), self.capacity),
        }
        self.max_wait_s = max_wait_s
        self.in_triton = 0
        self._waiting: dict[Priority, Turns[tuple[int, asyncio.Future[None]]]] = {
            priority: Turns() for priority in Priority
        }
        # the event loop keeps only weak references to tasks
        self._calls: set[asyncio.Future[Any]] = set()

    @property
    def waiting(self) -> int:
        """Calls waiting for room, of either priority."""
        return sum(map(len, self._waiting.values()))

    async def run(
        self,
        rows: int,
        call: Callable[[], Awaitable[T]],
        priority: Priority = Priority.ONLINE,
        client: str = "",
    ) -> T:
        """`call()` once `rows` fit, in `client`'s turn; it finishes even if the caller is
        cancelled meanwhile."""
        rows = min(rows, self.limits[priority])
        ahead = any(self._waiting[first] for first in Priority if first <= priority)
        if ahead or self.in_triton + rows > self.limits[priority]:
            turn = asyncio.get_running_loop().create_future()
            queue = self._waiting[priority]
            queue.add(client, (rows, turn))
            try:
                await asyncio.wait_for(asyncio.shield(turn), self.max_wait_s)
            except (asyncio.CancelledError, TimeoutError) as stop:
                if turn.done() and not turn.cancelled():  # admitted just before
                    if isinstance(stop, TimeoutError):
                        return await self._call(rows, call)
                    self._release(rows)
                else:
                    turn.cancel()
                    queue.discard(client, (rows, turn))
                    self._admit()  # it may have held back smaller calls behind it
                if isinstance(stop, TimeoutError):
                    raise queue_time_passed(self.max_wait_s) from None
                raise
        else:
            self.in_triton += rows
        return await self._call(rows, call)

    async def _call(self, rows: int, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call()` holding `rows` (already counted) until Triton answers."""
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
        """Let in the calls that fit, in order: online first, and no bulk call past an online one."""
        for priority, queue in self._waiting.items():
            while queue:
                rows, turn = queue.first()
                if not turn.cancelled() and self.in_triton + rows > self.limits[priority]:
                    return
                queue.take()
                if not turn.cancelled():  # a cancelled caller is leaving: it takes nothing
                    self.in_triton += rows
                    turn.set_result(None)


def connection_ceiling() -> int:
    """The most client connections the process's file-descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = UNLIMITED_FDS if soft == resource.RLIM_INFINITY else soft
    return max(limit - RESERVED_FDS, 1)


def grpc_connection_cap(requested: int | None) -> int:
    """`--max-grpc-connections`, or a quarter of the ceiling when unset (never past the ceiling)."""
    ceiling = connection_ceiling()
    return _capped("--max-grpc-connections", requested or max(ceiling // 4, 1), ceiling)


def connection_cap(requested: int | None, grpc_cap: int | None = None) -> int:
    """`--max-connections` (HTTP), or the ceiling when unset or above it (a cap above the descriptor
    limit would let accept() fail before the cap refuses anyone), less the gRPC port's own budget
    `grpc_cap` when it has one: the two never share descriptors."""
    ceiling = max(connection_ceiling() - (grpc_cap or 0), 1)
    return ceiling if requested is None else _capped("--max-connections", requested, ceiling)


def _capped(flag: str, requested: int, ceiling: int) -> int:
    if requested > ceiling:
        log.warning(
            "%s %d is above what the file-descriptor limit (ulimit -n) leaves it; using %d",
            flag,
            requested,
            ceiling,
        )
    return min(requested, ceiling)
