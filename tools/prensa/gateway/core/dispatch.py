"""How one served model's inputs reach Triton: cut into calls Triton takes, texts merged across
requests, and the rows an ensemble has in Triton bounded (as TEI keeps one queue per model in its
router). One `ModelDispatch` per served model owns the three, sized by one formula; the
`Dispatcher` builds it again, whole, when the registry reads the model again (reloaded or
reconfigured), so no part keeps the old model's sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy.typing as npt

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.coalesce import Coalescer
from prensa.gateway.core.limits import TritonWindow
from prensa.gateway.core.registry import ServedModel
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
        self.chunk_rows = max(1, min(model.max_batch_size, settings.max_client_batch_size))
        # A fused model drops a cancelled call itself (its batcher, or the model before computing it).
        self.window = (
            None
            if model.fused
            else TritonWindow(self.calls * model.max_batch_size, settings.max_queue_time_s)
        )
        # by outputs, with pairs or not
        self.coalescers: dict[tuple[tuple[str, ...], bool], Coalescer] = {}

    def chunks(self, count: int) -> list[slice]:
        """`count` inputs as calls of at most the model's batch (and the client batch limit)."""
        return [slice(start, start + self.chunk_rows) for start in range(0, count, self.chunk_rows)]

    async def texts(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        outputs: tuple[str, ...],
        request_id: str,
    ) -> Outputs:
        """One call on texts, merged with other requests' unless this one is traced (its own call
        carries its trace to Triton), Triton caches the model's answers (a cached answer is keyed
        on the call's exact texts: merged calls would almost never repeat), or merging is off."""
        if not self.settings.coalesce_requests or self.model.cached or sampled():
            return await self.send(texts, pairs, outputs, request_id)
        key = (outputs, pairs is not None)
        if key not in self.coalescers:
            self.coalescers[key] = Coalescer(
                lambda t, p, rid: self.send(t, p, outputs, rid),
                max_calls=self.calls,
                max_rows=self.model.max_batch_size,
                on_merge=self.on_merge,
                max_wait_s=self.settings.max_queue_time_s,
            )
        return await self.coalescers[key].call(texts, pairs, request_id)

    async def send(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None,
        outputs: tuple[str, ...],
        request_id: str,
    ) -> Outputs:
        """One call on texts as they are, through the window of an ensemble."""
        inputs = {contract.TEXT: texts_tensor(texts)}
        if pairs is not None:
            inputs[contract.TEXT_PAIR] = texts_tensor(pairs)
        if self.window is None:
            return await self.client.infer(self.model.name, inputs, outputs, request_id)
        return await self.window.run(
            len(texts), lambda: self.client.infer(self.model.name, inputs, outputs, request_id)
        )


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
