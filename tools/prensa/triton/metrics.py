"""Triton's Prometheus metrics (:8002) read back as per-model figures.

Used by `prensa stats`, the benchmarks and the load tests: average batch size is
`nv_inference_count / nv_inference_exec_count`; queue and compute times are cumulative
microseconds divided by successful requests; the encoder stage adds its real and padded token
counters (`prensa_encoder_*_tokens`), which it sends up to `TOKEN_COUNTERS_LAG_S` after an execute.
A model with Triton's response cache on adds its hits and misses (`nv_cache_*_per_model`, exported
only while Triton runs with a cache); a hit counts as a success with no execution, inference or
compute time.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
    "nv_inference_request_duration_us": "request_us",
    "prensa_encoder_real_tokens": "real_tokens",
    "prensa_encoder_padded_tokens": "padded_tokens",
    "nv_cache_num_hits_per_model": "cache_hits",
    "nv_cache_num_misses_per_model": "cache_misses",
    "nv_cache_hit_duration_per_model": "cache_hit_us",
    "nv_cache_miss_duration_per_model": "cache_miss_us",  # lookup and insertion
}
# The encoder stage sends its token counters from a thread, 50 ms after the executes they count
# (`TokenCounters` in prensa/ensembles/encode/model.py); a reader wanting all of them waits this long.
TOKEN_COUNTERS_LAG_S = 0.2


@dataclass(frozen=True)
class ModelStats:
    model: str
    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    request_us: float = 0.0
    real_tokens: float = 0.0
    padded_tokens: float = 0.0
    cache_hits: float = 0.0
    cache_misses: float = 0.0
    cache_hit_us: float = 0.0
    cache_miss_us: float = 0.0

    @property
    def average_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @property
    def queue_ms_per_request(self) -> float:
        return self.queue_us / 1000 / self.success if self.success else 0.0

    @property
    def compute_ms_per_request(self) -> float:
        return self.compute_us / 1000 / self.success if self.success else 0.0

    @property
    def padding_ratio(self) -> float | None:
        """Tokens computed per real token (1.0 = no padding); None where no encoder counts them."""
        return self.padded_tokens / self.real_tokens if self.real_tokens else None

    @property
    def cache_lookups(self) -> float:
        return self.cache_hits + self.cache_misses

    @property
    def cache_hit_ratio(self) -> float | None:
        """Requests answered from Triton's response cache per lookup; None where nothing was looked up."""
        return self.cache_hits / self.cache_lookups if self.cache_lookups else None

    def __sub__(self, earlier: ModelStats) -> ModelStats:
        return ModelStats(
            self.model, **{f: getattr(self, f) - getattr(earlier, f) for f in COUNTERS.values()}
        )


def parse_metrics(text: str) -> dict[str, ModelStats]:
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = COUNTERS.get(sample.name) or COUNTERS.get(sample.name.removesuffix("_total"))
            model = sample.labels.get("model")
            if field and model:
                values[model][field] = values[model].get(field, 0.0) + sample.value
    return {model: ModelStats(model, **fields) for model, fields in values.items()}


def scrape(metrics_url: str, timeout_s: float = 5.0) -> dict[str, ModelStats]:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:  # noqa: S310 - our own Triton
        return parse_metrics(response.read().decode())


def difference(
    after: dict[str, ModelStats], before: dict[str, ModelStats]
) -> dict[str, ModelStats]:
    return {name: stats - before.get(name, ModelStats(name)) for name, stats in after.items()}
