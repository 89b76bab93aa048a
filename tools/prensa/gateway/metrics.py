"""Prometheus series under TEI's names, so TEI dashboards and alerts keep working.

TEI exports counters without the `_total` suffix that prometheus_client's `Counter` always
adds; `TeiCounter` keeps TEI's exact sample names (exposed as untyped series, which PromQL's
`rate()` treats like counters). Labels are bounded: route names and error kinds only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = tuple(float(2**i) for i in range(19))  # 1 .. 262144
BATCH_BUCKETS = tuple(float(2**i) for i in range(8))  # 1 .. 128


class TeiCounter(Collector):
    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self._values: defaultdict[tuple[str, ...], float] = defaultdict(float)
        registry.register(self)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self._values[labels] += amount

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "unknown")
        for labels, value in list(self._values.items()):
            family.add_sample(self.name, dict(zip(self.labelnames, labels)), value)
        yield family


EMBED_METHODS = frozenset({"embed", "embed_sparse", "embed_all", "embed_colbert", "openai_embeddings", "similarity"})
PREDICT_METHODS = frozenset({"predict", "rerank", "openai_rerank"})


class GatewayMetrics:
    """One registry per app, so several gateways can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.request_count = TeiCounter("te_request_count", "Requests received, by route", ("method",), r)
        self.request_success = TeiCounter("te_request_success", "Requests answered, by route", ("method",), r)
        self.request_failure = TeiCounter("te_request_failure", "Requests failed, by error kind", ("err",), r)
        self.embed_count = TeiCounter("te_embed_count", "Embedding requests received", ("method",), r)
        self.embed_success = TeiCounter("te_embed_success", "Embedding requests answered", ("method",), r)
        self.predict_count = TeiCounter("te_predict_count", "Classification and rerank requests received", ("method",), r)
        self.predict_success = TeiCounter("te_predict_success", "Classification and rerank requests answered", ("method",), r)
        self.request_duration = Histogram("te_request_duration", "Request duration (s)", buckets=DURATION_BUCKETS, registry=r)
        self.tokenization_duration = Histogram("te_request_tokenization_duration", "Gateway tokenization (s)",
                                               buckets=DURATION_BUCKETS, registry=r)
        self.queue_duration = Histogram("te_request_queue_duration", "Arrival to first Triton call (s)",
                                        buckets=DURATION_BUCKETS, registry=r)
        self.inference_duration = Histogram("te_request_inference_duration", "Triton calls, wall time (s)",
                                            buckets=DURATION_BUCKETS, registry=r)
        self.input_length = Histogram("te_request_input_length", "Tokens per input", buckets=TOKEN_BUCKETS, registry=r)
        self.batch_next_size = Histogram("te_batch_next_size", "Rows per Triton call", buckets=BATCH_BUCKETS, registry=r)
        self.batch_next_tokens = Histogram("te_batch_next_tokens", "Tokens per Triton call", buckets=TOKEN_BUCKETS, registry=r)
        self.queue_size = Gauge("te_queue_size", "Inputs in flight (permits held)", registry=r)

    def _family(self, method: str) -> tuple[TeiCounter, TeiCounter] | None:
        if method in EMBED_METHODS:
            return self.embed_count, self.embed_success
        if method in PREDICT_METHODS:
            return self.predict_count, self.predict_success
        return None

    def started(self, method: str) -> None:
        self.request_count.inc(method)
        if family := self._family(method):
            family[0].inc(method)

    def succeeded(self, method: str, duration_s: float) -> None:
        self.request_success.inc(method)
        if family := self._family(method):
            family[1].inc(method)
        self.request_duration.observe(duration_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
