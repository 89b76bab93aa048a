"""The autoscaler's metric is built from series a real Triton exports, per encoder model."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from prensa.deploy.k8s import (
    ADAPTER_VALUES,
    QUEUE_SERIES,
    SUCCESS_SERIES,
    K8sOptions,
    read_repository,
    render,
)
from prensa.triton.metrics import parse_metrics
from tests.conftest import counted_since

pytestmark = pytest.mark.triton


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$", re.M)


def exposition(metrics_url: str) -> str:
    return urllib.request.urlopen(metrics_url, timeout=5).read().decode()  # noqa: S310 - a local http URL


def samples(text: str) -> dict[tuple[str, str], float]:
    """(series, model label) -> value, under the names Prometheus stores: the exposition text as
    it is (prometheus_client's parser would add `_total` to counters, Prometheus does not)."""
    return {(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("model", "")): float(value)
            for name, labels, value in SAMPLE.findall(text)}


def test_adapter_rule_and_hpa_use_series_triton_exports(triton):
    models = read_repository(triton.options.repo)
    files = render(models, K8sOptions(repo_image="unused"))
    (rule,) = files[ADAPTER_VALUES]["rules"]["custom"]
    query = rule["metricsQuery"]
    series = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query)) | set(re.findall(r"^(\w+)\{", rule["seriesQuery"]))
    assert series == {QUEUE_SERIES, SUCCESS_SERIES}
    encoders = re.search(r'model=~"([^"]+)"', query).group(1).split("|")
    assert sorted(encoders) == sorted(m.encoder.model for m in models)  # `<name>_encode`, or a fused `<name>`

    text = grpcclient.InferInput("text", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"what is queue time?"], [b"time spent waiting for an encoder"]], dtype=object))
    first = exposition(triton.metrics_url)
    grpcclient.InferenceServerClient(triton.grpc_url).infer("bge-m3", [text])
    counted_since(triton.metrics_url, parse_metrics(first), ("bge-m3_encode",), 1)
    before, after = samples(first), samples(exposition(triton.metrics_url))
    for name in series:
        missing = [e for e in encoders if (name, e) not in after]
        assert not missing, f"Triton exports no {name} for {missing}"
    # The rule's numerator and denominator over this one request: one encoder request, and its
    # queue time in microseconds (the ensemble's own queue series would miss the stages' queues).
    requests = after[SUCCESS_SERIES, "bge-m3_encode"] - before[SUCCESS_SERIES, "bge-m3_encode"]
    queued = after[QUEUE_SERIES, "bge-m3_encode"] - before[QUEUE_SERIES, "bge-m3_encode"]
    assert requests == 1 and 0 <= queued < 10_000_000
