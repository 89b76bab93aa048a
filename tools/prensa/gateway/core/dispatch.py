"""How one served model's inputs reach Triton: cut into calls Triton takes, texts merged across
requests, and the rows an ensemble has in Triton bounded (as TEI keeps one queue per model in its
router). One `ModelDispatch` per served model owns the three, sized by one formula; the
`Dispatcher` builds it again, whole, when the registry reads the model again (reloaded or
reconfigured), so no part keeps the old model's sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy.typing as npt

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.coalesce import Coalescer
from prensa.gateway.core.limits import TritonWindow
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import Priority
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import sampled
from prensa.stages import contract
from prensa.tensors import texts_tensor

Outputs = dict[str, npt.NDArray[Any]]

# Calls of one model in Triton per replica: one per encoder instance computing, and this many more
# tokenized and waiting, so no instance waits for the gateway.
SPARE_CALLS = 1


def calls_in_triton(model: ServedModel, replicas: int) -> int:
    """Calls of full batches `model` keeps busy across `replicas` Tritons: what merging waits for
    and what the window lets in (in rows: this times `max_batch_size`)."""
    return (model.encode_instances + SPARE_CALLS) * max(replicas, 1)


def bulk_calls(calls: int, priority: bool) -> int:
    """Of `calls`, those bulk work may hold: with priority on, one stays free for an online query."""
    return max(calls - 1, 1) if priority else calls


class BulkPace:
    """How many rows one bulk call carries. While online requests come (one within QUIET_S), a
    bulk call carries as many rows as take about `seconds` (--bulk-call-time) in Triton: an online
    query then waits about that long behind bulk work at most, since Triton does not stop a call
    it computes. That is learnt from the model's own bulk calls (seconds per row, a moving mean,
    which holds each call's fixed cost too); the first carries one row. With no online request
    for QUIET_S, bulk calls are full batches (`most`): the first query after a quiet spell waits
    for one of them."""

    SMOOTHING = 0.2
    QUIET_S = 10.0

    def __init__(self, seconds: float, most: int) -> None:
        self.seconds, self.most = seconds, most
        self.per_row: float | None = None
        self.online_seen = float("-inf")  # none yet: quiet

    @property
    def rows(self) -> int:
        if time.monotonic() - self.online_seen > self.QUIET_S:
            return self.most
        if self.per_row is None:
            return 1
        return max(1, min(self.most, int(self.seconds / self.per_row)))

    def online(self) -> None:
        """An online request came."""
        self.online_seen = time.monotonic()

    def took(self, seconds: float, rows: int) -> None:
        per_row = seconds / max(rows, 1)
        known = self.per_row
        self.per_row = per_row if known is None else known + self.SMOOTHING * (per_row - known)


class ModelDispatch:
    """One served model's dispatch: `chunks` cuts a request into calls, `texts` merges text calls
    with other requests' (`coalesce`), and an ensemble's calls wait in its `TritonWindow`."""

    def __init__(
        self,
        model: ServedModel,
        settings: GatewaySettings,
        client: Backend,
        on_merge: Callable[[int], None],
    ) -> None:
        self.model, self.settings, self.client, self.on_merge = model, settings, client, on_merge
        self.calls = calls_in_triton(model, client.replica_count)
        self.bulk_calls = bulk_calls(self.calls, settings.priority)
        self.chunk_rows = max(1, min(model.max_batch_size, settings.max_client_batch_size))
        self.pace = (
            BulkPace(settings.bulk_call_time_s, model.max_batch_size) if settings.priority else None
        )
        # A fused model drops a cancelled call itself (its batcher, or the model before computing it).
        self.window = (
            None
            if model.fused
            else TritonWindow(
                self.calls * model.max_batch_size,
                settings.max_queue_time_s,
                self.bulk_calls * model.max_batch_size,
            )
        )
        # by outputs, with pairs or not
        self.coalescers: dict[tuple[tuple[str, ...], bool], Coalescer] = {}

    def chunks(
        self, count: int, priority: Priority = Priority.ONLINE, paced: bool = True
    ) -> list[slice]:
        """`count` inputs as calls of at most the model's batch (and the client batch limit); bulk
        work's text calls as calls of its pace (`paced`: token-id calls go to Triton at once,
        through no queue of the gateway's, and are not paced)."""
        if priority is Priority.ONLINE and self.pace is not None:
            self.pace.online()
        paced_rows = self.bulk_rows(priority) if paced else None
        rows = min(paced_rows or self.chunk_rows, self.chunk_rows)
        return [slice(start, start + rows) for start in range(0, count, rows)]

    def bulk_rows(self, priority: Priority) -> int | None:
        """The rows one Triton call of `priority` may carry when bulk work is paced, else None."""
        if priority is Priority.ONLINE or self.pace is None:
            return None
        return self.pace.rows

    async def texts(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        outputs: tuple[str, ...],
        request_id: str,
        priority: Priority = Priority.ONLINE,
        client: str = "",
    ) -> Outputs:
        """One call on texts, in `client`'s turn, merged with other requests' unless this one is traced (its own call
        carries its trace to Triton), Triton caches the model's answers (a cached answer is keyed
        on the call's exact texts: merged calls would almost never repeat), or merging is off."""
        if not self.settings.priority:
            priority = Priority.ONLINE  # one queue, first come first served
        if not self.settings.coalesce_requests or self.model.cached or sampled():
            return await self.send(texts, pairs, outputs, request_id, priority, client)
        key = (outputs, pairs is not None)
        if key not in self.coalescers:
            self.coalescers[key] = Coalescer(
                lambda t, p, rid, first, client: self.send(t, p, outputs, rid, first, client),
                max_calls=self.calls,
                max_rows=self.model.max_batch_size,
                on_merge=self.on_merge,
                max_wait_s=self.settings.max_queue_time_s,
                bulk_calls=self.bulk_calls,
                bulk_rows=lambda: self.bulk_rows(Priority.BULK) or self.model.max_batch_size,
            )
        return await self.coalescers[key].call(texts, pairs, request_id, priority, client)

    async def send(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        outputs: tuple[str, ...],
        request_id: str,
        priority: Priority = Priority.ONLINE,
        client: str = "",
    ) -> Outputs:
        """One call on texts as they are, through the window of an ensemble."""
        inputs = {contract.TEXT: texts_tensor(texts)}
        if pairs is not None:
            inputs[contract.TEXT_PAIR] = texts_tensor(pairs)

        async def call() -> Outputs:
            started = time.perf_counter()
            answer = await self.client.infer(self.model.name, inputs, outputs, request_id)
            if priority is Priority.BULK and self.pace is not None:
                self.pace.took(time.perf_counter() - started, len(texts))
            return answer

        if self.window is None:
            return await call()
        return await self.window.run(len(texts), call, priority, client)


class Dispatcher:
    """The `ModelDispatch` of each served model, built again when the model is read again."""

    def __init__(
        self, settings: GatewaySettings, client: Backend, on_merge: Callable[[int], None]
    ) -> None:
        self.settings, self.client, self.on_merge = settings, client, on_merge
        self.models: dict[str, ModelDispatch] = {}

    def __call__(self, model: ServedModel) -> ModelDispatch:
        known = self.models.get(model.name)
        if known is None or known.model is not model:  # new, or the registry read it again
            known = self.models[model.name] = ModelDispatch(
                model, self.settings, self.client, self.on_merge
            )
        return known
