"""Concurrent requests' texts merged into one Triton call (as TEI batches in its router).

Short queries cost the gateway and Triton more per request than the encoder costs per query:
a gRPC call, Triton's ensemble scheduling and one to three Python-backend round trips each. A
`Coalescer` keeps at most `max_calls` calls of one ensemble in Triton; a text call that finds a
free place goes out at once (a lone query waits for nothing), and calls that arrive while every
place is taken wait and leave together, as one call of up to `max_rows` rows, when one returns.
Each caller gets exactly its own rows back.

Only calls whose answer does not depend on their neighbours are merged: texts (or text pairs) for
the same model and outputs, tokenized by Triton with its right truncation at the model's max
length. A merged call that fails is retried call by call, so a bad input fails its own request
only. A caller that leaves while waiting takes nothing; one that leaves while its call runs only
drops its rows of the answer, and the call is cancelled when every caller in it has left (a
fused model's request then leaves Triton's queue, as a lone request's does).

Online calls go before bulk ones (`Priority`): a freed place goes to the online calls waiting, and
bulk calls hold at most `bulk_calls` places, so that an online query finds one free and waits in
Triton behind at most the bulk call computing. Calls of the two kinds are never merged: an online
query does not wait for a bulk call's rows. Within a priority, waiting calls leave in turn by
client (`Turns`): a flood on one connection delays another client's query by one call of it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from prensa.gateway.core.request_context import Priority
from prensa.gateway.core.turns import Turns
from prensa.gateway.errors import ErrorKind, GatewayError, queue_time_passed

Outputs = dict[str, npt.NDArray[Any]]
# Sends texts (and their pairs) to Triton as one call, in a client's turn:
# `(texts, pairs, request_id, priority, client) -> outputs`.
Send = Callable[[Sequence[str], Sequence[str] | None, str, Priority, str], Awaitable[Outputs]]
# Errors that say something about the merged inputs, not about Triton: retried call by call.
INPUT_ERRORS = frozenset({ErrorKind.BACKEND, ErrorKind.VALIDATION, ErrorKind.TOKENIZER})


@dataclass(eq=False)
class Waiting:
    texts: Sequence[str]
    pairs: Sequence[str] | None
    request_id: str
    priority: Priority
    client: str
    answer: asyncio.Future[Outputs] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    group: list[Waiting] = field(default_factory=list)  # the calls it left with, itself included
    sent: asyncio.Task[None] | None = None  # their merged call
    left: bool = False  # its caller is gone


def split_rows(outputs: Outputs, sizes: Sequence[int]) -> list[Outputs]:
    """`outputs` of a merged call cut back into each caller's rows, in order. Rows of tensors whose
    width follows the batch (sparse terms, ColBERT tokens) keep the batch's padding, which the
    service already ignores (`SPARSE_PAD_ID`, `NUM_TOKENS`)."""
    bounds = itertools.accumulate(sizes, initial=0)
    return [
        {name: value[start:end] for name, value in outputs.items()}
        for start, end in itertools.pairwise(bounds)
    ]


class Coalescer:
    """The text calls of one ensemble (one model, one set of outputs, with or without pairs)."""

    def __init__(
        self,
        send: Send,
        max_calls: int,
        max_rows: int,
        on_merge: Callable[[int], None] = lambda requests: None,
        max_wait_s: float | None = None,
        bulk_calls: int | None = None,
        bulk_rows: Callable[[], int] | None = None,
    ) -> None:
        """`max_wait_s` (--max-queue-time): a call not sent within it leaves overloaded.
        `bulk_calls`: the places bulk calls may hold (default: all of them); `bulk_rows`: the rows
        a merged bulk call may carry now (default: `max_rows`)."""
        self.send = send
        self.max_wait_s = max_wait_s
        self.on_merge = on_merge  # told how many waiting calls leave together
        self.max_calls = max(max_calls, 1)
        self.places = {
            Priority.ONLINE: self.max_calls,
            Priority.BULK: min(max(bulk_calls or self.max_calls, 1), self.max_calls),
        }
        self.max_rows = max(max_rows, 1)
        self.bulk_rows = bulk_rows or (lambda: self.max_rows)
        self.in_triton = 0
        self.waiting: dict[Priority, Turns[Waiting]] = {priority: Turns() for priority in Priority}
        # the event loop keeps only weak references to tasks
        self._calls: set[asyncio.Task[None]] = set()

    async def call(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        request_id: str,
        priority: Priority = Priority.ONLINE,
        client: str = "",
    ) -> Outputs:
        """The outputs of `texts` (at most `max_rows`), alone or merged with others' texts;
        `client` is whose turn it waits for (`Turns`)."""
        if self.in_triton < self.places[priority] and not self._ahead_of(priority):
            self.in_triton += 1
            try:
                return await self.send(texts, pairs, request_id, priority, client)
            finally:
                self._finished()
        waiting = Waiting(texts, pairs, request_id, priority, client)
        queue = self.waiting[priority]
        queue.add(client, waiting)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(waiting.answer), self.max_wait_s)
            except TimeoutError:
                if queue.discard(client, waiting):  # not sent within the queue time: it leaves now
                    raise queue_time_passed(self.max_wait_s) from None
                return await asyncio.shield(waiting.answer)  # sent: its answer is on its way
        except asyncio.CancelledError:
            # not sent yet: it leaves without reaching Triton; sent: a merged call whose callers
            # are all gone is cancelled, so Triton drops it
            if not queue.discard(client, waiting):
                waiting.left = True
                if waiting.sent is not None and all(one.left for one in waiting.group):
                    waiting.sent.cancel()
            raise

    def _ahead_of(self, priority: Priority) -> bool:
        """Whether calls wait that go before a new one of `priority`: online ones for an online
        call, any for a bulk one."""
        if self.waiting[Priority.ONLINE]:
            return True
        return priority is Priority.BULK and bool(self.waiting[Priority.BULK])

    def _finished(self) -> None:
        self.in_triton -= 1
        for priority, queue in self.waiting.items():  # online first
            most = self.max_rows if priority is Priority.ONLINE else self.bulk_rows()
            while queue and self.in_triton < self.places[priority]:
                self._leave(self._group(queue, most))

    @staticmethod
    def _group(queue: Turns[Waiting], most: int) -> list[Waiting]:
        """The calls whose turn it is that fit one call of `most` rows (the first always)."""
        group: list[Waiting] = []
        rows = 0
        while queue and (not group or rows + len(queue.first().texts) <= most):
            rows += len(queue.first().texts)
            group.append(queue.take())
        return group

    def _leave(self, group: list[Waiting]) -> None:
        """`group` sent as one call, holding a place until it ends."""
        self.in_triton += 1
        self.on_merge(len(group))
        task = asyncio.ensure_future(self._run(group))
        for one in group:
            one.group, one.sent = group, task
        self._calls.add(task)
        task.add_done_callback(self._done)

    async def _run(self, group: list[Waiting]) -> None:
        if len(group) == 1:
            await self._alone(group[0])
            return
        texts = [text for one in group for text in one.texts]
        pairs = (
            [pair for one in group for pair in one.pairs or ()]
            if group[0].pairs is not None
            else None
        )
        try:
            first = group[0]
            merged = await self.send(texts, pairs, first.request_id, first.priority, first.client)
        except GatewayError as exc:
            if exc.kind in INPUT_ERRORS:  # whose input? each call alone says
                await asyncio.gather(*(self._alone(one) for one in group))
            else:
                for one in group:
                    self._fail(one, exc)
            return
        except Exception as exc:  # noqa: BLE001 - every caller gets it
            for one in group:
                self._fail(one, exc)
            return
        for one, rows in zip(group, split_rows(merged, [len(one.texts) for one in group])):
            self._settle(one, rows)

    def _done(self, task: asyncio.Task[None]) -> None:
        """A merged call's place is free again: called once however its task ended, cancelled
        before it ever ran included (its `finally` would never run then)."""
        self._calls.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: `_run` hands every error to its callers
        self._finished()

    async def _alone(self, one: Waiting) -> None:
        try:
            self._settle(
                one, await self.send(one.texts, one.pairs, one.request_id, one.priority, one.client)
            )
        except Exception as exc:  # noqa: BLE001 - the caller gets it
            self._fail(one, exc)

    @staticmethod
    def _settle(one: Waiting, outputs: Outputs) -> None:
        if not one.answer.done():
            one.answer.set_result(outputs)

    @staticmethod
    def _fail(one: Waiting, exc: BaseException) -> None:
        if not one.answer.done():
            one.answer.set_exception(exc)
            one.answer.exception()  # retrieved: a caller that left never awaits it
