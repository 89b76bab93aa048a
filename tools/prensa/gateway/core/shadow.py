"""An embedder's version on trial compared with the current one on live requests, never answering
(`prensa models shadow NAME@N`).

Vectors of two versions do not mix: an index built with one must be queried with the same one, so
no share of an embedder's traffic may go to a candidate. The shadow instead gets a copy of each
dense request the current version answers, after the answer and off its path: as bulk work in the
gateway's queues, at most MAX_COPIES at once, and skipped when that many run or the permits have no
room. It still takes its own share of Triton, whose queues do not know it is a copy. The gateway's
metrics say how far the two versions are apart:

- per input, the cosine between the two versions' vectors (`prensa_shadow_cosine`): near 1 for a
  re-export or a quantized copy, near 0 for another model's space;
- per input, how many of its nearest neighbours among the recent inputs the two versions agree on
  (`prensa_shadow_top_k_agreement`): what retrieval would notice, meaningful across spaces too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prensa.gateway.core.asks import Ask, Vectors
from prensa.gateway.core.registry import Registry
from prensa.gateway.core.request_context import Priority, RequestContext
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.metrics import GatewayMetrics

if TYPE_CHECKING:
    from prensa.gateway.core.service import Service

log = logging.getLogger("prensa.gateway")
TOP_K = 10
RECENT = 512  # inputs kept per comparison, the neighbours the top-k agreement is counted among
# copies in flight at once; past it a request is not copied (counted skipped), so that a shadow
# never takes more than this of the server from the online requests it copies
MAX_COPIES = 4
Rows = npt.NDArray[np.float32]


def unit(rows: Rows) -> Rows:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.asarray(rows / np.maximum(norms, 1e-12), dtype=np.float32)


class Comparison:
    """The recent inputs' vectors in both versions (a ring of `recent` rows each), and how far new
    ones agree."""

    def __init__(self, recent: int = RECENT, top_k: int = TOP_K) -> None:
        self.recent, self.top_k = recent, top_k
        self.current: Rows | None = None
        self.candidate: Rows | None = None
        self.seen = 0  # inputs kept so far, all told

    def add(self, current: Rows, candidate: Rows) -> tuple[list[float], list[float]]:
        """Each input's cosine (none where the two widths differ) and top-k agreement (none until
        more than `top_k` inputs were seen); then the inputs join the recent ones."""
        current, candidate = unit(current), unit(candidate)
        cosines = (
            np.einsum("ij,ij->i", current, candidate).tolist()
            if current.shape == candidate.shape
            else []
        )
        agreements: list[float] = []
        known = min(self.seen, self.recent)
        if self.current is not None and self.candidate is not None and known > self.top_k:
            near_current = self._nearest(self.current[:known] @ current.T)
            near_candidate = self._nearest(self.candidate[:known] @ candidate.T)
            agreements = [
                len(one & other) / self.top_k for one, other in zip(near_current, near_candidate)
            ]
        self._keep(current, candidate)
        return cosines, agreements

    def _nearest(self, similarities: npt.NDArray[Any]) -> list[set[int]]:
        """Per column (an input), the rows of its `top_k` most similar recent inputs."""
        top = np.argpartition(-similarities, self.top_k, axis=0)[: self.top_k]
        return [set(column) for column in top.T.tolist()]

    def _keep(self, current: Rows, candidate: Rows) -> None:
        if self.current is None or self.candidate is None:
            self.current = np.zeros((self.recent, current.shape[1]), dtype=np.float32)
            self.candidate = np.zeros((self.recent, candidate.shape[1]), dtype=np.float32)
        for one, other in zip(current, candidate):
            slot = self.seen % self.recent
            self.current[slot], self.candidate[slot] = one, other
            self.seen += 1


class Shadows:
    """Copies of the answered dense requests of models that have a shadow (`Registry.shadow_of`)."""

    def __init__(self, registry: Registry, metrics: GatewayMetrics) -> None:
        self.registry, self.metrics = registry, metrics
        self.comparisons: dict[tuple[str, str], Comparison] = {}
        self._failing: set[tuple[str, str]] = set()  # said once per pair
        # the event loop keeps only weak references to tasks
        self._copies: set[asyncio.Task[None]] = set()

    def copy(
        self, service: Service, ask: Ask[Any], answer: object, context: RequestContext
    ) -> None:
        """Send `ask` to its model's shadow too, after `answer`, when it has one and `answer` is
        vectors of the model's full width (cut ones would not compare with the recent inputs); the
        request's answer does not wait for it."""
        if not self.registry.on_trial:  # every request passes here: the common case first
            return
        if not isinstance(answer, Vectors) or answer.rows.shape[1] != ask.model.dense_dim:
            return
        shadow = self.registry.shadow_of(ask.model.name)
        if shadow is None:
            return
        if len(self._copies) >= MAX_COPIES:
            self.metrics.shadow_inputs.inc(
                ask.model.name, shadow.name, "skipped", amount=len(answer.rows)
            )
            return
        copied = replace(ask, model=shadow)
        task = asyncio.ensure_future(
            self._compare(service, copied, answer, ask.model.name, context)
        )
        self._copies.add(task)
        task.add_done_callback(self._copies.discard)

    async def _compare(
        self,
        service: Service,
        copied: Ask[Any],
        answer: Vectors,
        model: str,
        context: RequestContext,
    ) -> None:
        candidate = copied.model.name
        own = RequestContext(
            received=time.perf_counter(),
            request_id=f"{context.request_id}-shadow",
            priority=Priority.BULK,
            client=f"shadow:{candidate}",
        )
        try:
            shadowed = await service.run(copied, own)
            comparison = self.comparisons.setdefault((model, candidate), Comparison())
            cosines, agreements = comparison.add(answer.rows, shadowed.rows)
        except Exception as exc:  # noqa: BLE001 - a shadow's fault never reaches a client
            overloaded = isinstance(exc, GatewayError) and exc.kind is ErrorKind.OVERLOADED
            outcome = "skipped" if overloaded else "failed"
            self.metrics.shadow_inputs.inc(model, candidate, outcome, amount=len(answer.rows))
            if outcome == "failed" and (model, candidate) not in self._failing:
                self._failing.add((model, candidate))
                log.warning("the shadow %s of %s cannot answer a copy: %s", candidate, model, exc)
            return
        for cosine in cosines:
            self.metrics.shadow_cosine.labels(model, candidate).observe(cosine)
        for agreement in agreements:
            self.metrics.shadow_agreement.labels(model, candidate).observe(agreement)
        self.metrics.shadow_inputs.inc(model, candidate, "compared", amount=len(answer.rows))
