"""`prensa stats` and the encoder's token counters, read from a real Triton's metrics port."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from typer.testing import CliRunner

from prensa.cli import app
from prensa.triton.metrics import difference, scrape

pytestmark = pytest.mark.triton


def test_stats_reports_requests_batches_and_padding(triton):
    before = scrape(triton.metrics_url)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    texts = ["short", "a somewhat longer text with several more words in it", "x y"]
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    client.infer("minilm", [tensor])
    deadline = time.monotonic() + 5  # the token counters are sent a moment after the request
    while not (delta := difference(scrape(triton.metrics_url), before)["minilm_encode"]).padded_tokens:
        assert time.monotonic() < deadline, "token counters never arrived"
        time.sleep(0.05)
    assert delta.success == 1 and delta.inferences == len(texts)
    # 3 rows of lengths 3, 12 and 4 tokens (with [CLS]/[SEP]): real tokens are exact.
    assert delta.real_tokens == 19
    assert delta.padded_tokens >= delta.real_tokens
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["stats", "--metrics-url", triton.metrics_url])
    assert result.exit_code == 0 and "minilm_encode" in result.output
