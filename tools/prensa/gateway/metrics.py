"""Prometheus series under TEI's names, so TEI dashboards and alerts keep working.

TEI exports counters without the `_total` suffix that prometheus_client's `Counter` always
adds; `TeiCounter` keeps TEI's exact sample names (exposed as untyped series, which PromQL's
`rate()` treats like counters). Labels are bounded: route names, error kinds, and the served
models a shadow compares.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from prensa.triton.versions import pinned

DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
TOKEN_BUCKETS = tuple(float(2**i) for i in range(19))  # 1 .. 262144
BATCH_BUCKETS = tuple(float(2**i) for i in range(8))  # 1 .. 128
COSINE_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)
SHARE_BUCKETS = tuple(i / 10 for i in range(11))  # 0, 0.1 .. 1


# prometheus-client's multiprocess mode reads this variable
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess() -> bool:
    """Whether this process is one of several gateway workers (`prensa.gateway.workers`): its
    series then live in prometheus-client's files, summed over the workers at each scrape."""
    return bool(os.environ.get(MULTIPROCESS_DIR))


@functools.lru_cache(maxsize=1024)
def model_labels(model: str) -> tuple[str, str]:
    """A served model's `model` and `version` labels (`name@N` -> name, N), read once per name."""
    if not model:
        return "", ""
    name, version = pinned(model)
    return name, str(version or 1)


class TeiCounter(Collector):
    """Kept in an unregistered gauge that several workers sum (multiprocess mode "sum"); rendered
    as TEI's untyped series by this process alone, as gauges by `MultiProcessCollector`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self._store = Gauge(name, documentation, labelnames, registry=None, multiprocess_mode="sum")
        self._children: dict[tuple[str, ...], Gauge] = {}
        registry.register(self)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._store.labels(*labels)
        child.inc(amount)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "unknown")
        for stored in self._store.collect():
            for sample in stored.samples:
                family.add_sample(self.name, sample.labels, sample.value)
        yield family


EMBED_METHODS = frozenset(
    {
        "embed",
        "pooling",
        "embed_m3",
        "embed_sparse",
        "embed_all",
        "embed_colbert",
        "openai_embeddings",
        "jina_multi_vector",
        "similarity",
        "embed_v1",
        "embed_v2",
    }
)
PREDICT_METHODS = frozenset(
    {"predict", "classify", "score", "rerank", "rerank_v1", "rerank_v2", "nim_ranking"}
)


class FamilyDurations:
    """TEI's per-family histograms (`te_embed_*`, `te_predict_*`): a request's whole time and its parts."""

    def __init__(self, prefix: str, what: str, registry: CollectorRegistry) -> None:
        def histogram(suffix: str, documentation: str) -> Histogram:
            return Histogram(
                f"{prefix}_{suffix}",
                f"{what}: {documentation} (s)",
                buckets=DURATION_BUCKETS,
                registry=registry,
            )

        self.duration = histogram("duration", "request duration")
        self.tokenization = histogram("tokenization_duration", "gateway tokenization")
        self.queue = histogram("queue_duration", "arrival to the first Triton call")
        self.inference = histogram("inference_duration", "Triton calls, wall time")

    def observe(
        self, duration_s: float, tokenization_s: float, queue_s: float, inference_s: float
    ) -> None:
        self.duration.observe(duration_s)
        self.tokenization.observe(tokenization_s)
        self.queue.observe(queue_s)
        self.inference.observe(inference_s)


@dataclass(frozen=True)
class Family:
    count: TeiCounter
    success: TeiCounter
    durations: FamilyDurations


class GatewayMetrics:
    """One registry per app, so several gateways can live in one process (tests).

    TEI's names where prensa measures what TEI's measure; `prensa_*` names where the meaning differs:
    the gateway has no batching queue (Triton does: `nv_inference_queue_duration_us` and
    `nv_inference_pending_request_count` on Triton's metrics port; the gateway only holds text calls
    to an ensemble in its `TritonWindow`), so what it can count is inputs in flight and the rows and
    tokens of each call it makes to Triton, not TEI's queue and next batch."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.request_count = TeiCounter(
            "te_request_count", "Requests received, by route", ("method",), r
        )
        self.request_success = TeiCounter(
            "te_request_success", "Requests answered, by route", ("method",), r
        )
        self.request_failure = TeiCounter(
            "te_request_failure", "Requests failed, by error kind", ("err",), r
        )
        self.embed = Family(
            TeiCounter("te_embed_count", "Embedding requests received", ("method",), r),
            TeiCounter("te_embed_success", "Embedding requests answered", ("method",), r),
            FamilyDurations("te_embed", "Embedding requests", r),
        )
        self.predict = Family(
            TeiCounter(
                "te_predict_count", "Classification and rerank requests received", ("method",), r
            ),
            TeiCounter(
                "te_predict_success", "Classification and rerank requests answered", ("method",), r
            ),
            FamilyDurations("te_predict", "Classification and rerank requests", r),
        )
        self.request_duration = Histogram(
            "te_request_duration", "Request duration (s)", buckets=DURATION_BUCKETS, registry=r
        )
        self.tokenization_duration = Histogram(
            "te_request_tokenization_duration",
            "Gateway tokenization (s)",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "te_request_queue_duration",
            "Arrival to first Triton call (s)",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "te_request_inference_duration",
            "Triton calls, wall time (s)",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.input_length = Histogram(
            "te_request_input_length", "Tokens per input", buckets=TOKEN_BUCKETS, registry=r
        )
        self.call_size = Histogram(
            "prensa_triton_call_size",
            "Rows per gateway call to Triton",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.call_tokens = Histogram(
            "prensa_triton_call_tokens",
            "Tokens per gateway call to Triton",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.merged_calls = Histogram(
            "prensa_coalesced_requests",
            "Requests per merged text call to Triton "
            "(--coalesce-requests; a call sent at once is not counted)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.inputs_in_flight = Gauge(
            "prensa_inputs_in_flight",
            "Inputs admitted and not yet answered (permits held)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.unsent_answer_bytes = Gauge(
            "prensa_unsent_answer_bytes",
            "Bytes of answers held for clients that have not read them (--max-unsent-bytes)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.inputs_limit = Gauge(
            "prensa_inputs_limit",
            "Permits in all (--max-concurrent-requests): inputs in flight past it get 429",
            registry=r,
            multiprocess_mode="livemax",
        )
        # TEI's request histogram has no route label; dashboards want each route's quantiles, and
        # a version on trial is judged beside the current one by its own.
        self.route_duration = Histogram(
            "prensa_request_duration",
            "Answered requests' duration, by route, served model and its version (s)",
            ("method", "model", "version"),
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.model_ready = Gauge(
            "prensa_model_ready",
            "1 while Triton can serve every stage of the model, else 0; "
            "read from Triton at each scrape",
            ("model",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # an embedder's shadow version beside its current one (`core.shadow`)
        trial = ("model", "candidate")
        self.shadow_cosine = Histogram(
            "prensa_shadow_cosine",
            "Per input, the cosine between the current version's vector and the shadow's",
            trial,
            buckets=COSINE_BUCKETS,
            registry=r,
        )
        self.shadow_agreement = Histogram(
            "prensa_shadow_top_k_agreement",
            "Per input, the share of its nearest recent inputs that the two versions agree on",
            trial,
            buckets=SHARE_BUCKETS,
            registry=r,
        )
        self.shadow_inputs = TeiCounter(
            "prensa_shadow_inputs",
            "Inputs copied to a shadow version, by outcome (compared, skipped: no room, failed)",
            (*trial, "outcome"),
            r,
        )
        # rendered after this one: `prensa serve`'s supervisor
        self.others: list[CollectorRegistry] = []

    def _family(self, method: str) -> Family | None:
        if method in EMBED_METHODS:
            return self.embed
        if method in PREDICT_METHODS:
            return self.predict
        return None

    def started(self, method: str) -> None:
        self.request_count.inc(method)
        if family := self._family(method):
            family.count.inc(method)

    def succeeded(
        self,
        method: str,
        duration_s: float,
        tokenization_s: float = 0.0,
        queue_s: float = 0.0,
        inference_s: float = 0.0,
        model: str = "",
    ) -> None:
        """`model`: the served model that answered (`name@N` for a later version), if any."""
        self.request_success.inc(method)
        if family := self._family(method):
            family.success.inc(method)
            family.durations.observe(duration_s, tokenization_s, queue_s, inference_s)
        self.request_duration.observe(duration_s)
        self.route_duration.labels(method, *model_labels(model)).observe(duration_s)

    def set_readiness(self, ready: dict[str, bool]) -> None:
        """`prensa_model_ready` for exactly the served models in `ready`."""
        if not multiprocess():  # prometheus-client cannot clear another process's series
            self.model_ready.clear()
        for model, up in ready.items():
            self.model_ready.labels(model).set(1.0 if up else 0.0)

    def render(self) -> bytes:
        """This gateway's series and the `others`; with several workers, every worker's, summed."""
        registries: tuple[CollectorRegistry, ...] = (self.registry, *self.others)
        if multiprocess():
            workers = CollectorRegistry()
            MultiProcessCollector(workers)  # type: ignore[no-untyped-call]
            registries = (workers, *self.others)
        return b"".join(generate_latest(registry) for registry in registries)
