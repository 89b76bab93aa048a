"""A lone client must never wait in Triton's queue: each request finds the encoder idle.

Triton 2.51's dynamic batcher can miss the wake-up that says an instance is free again, and then
sleeps 500 ms with the request queued. It takes that path only when a stage has a queue policy,
which prensa therefore leaves out by default (`dynamic_batching` in prensa/triton/config.py). With
the policy back and one encoder instance, 200 back-to-back requests here met the stall twice
through each layout (this test sends 400); one stall is enough to fail.

A stall shows as one request taking over half a second, where the others take milliseconds; the
test looks for that rather than at the queues' total, which a slow machine inflates evenly.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from prensa.triton.metrics import scrape
from tests.conftest import counted_since

pytestmark = pytest.mark.triton
REQUESTS = 400
STALL_MS = 500  # the batcher's default wait, and what one missed wake-up costs
SLOW_MS = 0.8 * STALL_MS
TEXTS = ["short query", "what does the encoder do with a somewhat longer question like this one?",
         "the river runs under seven bridges before it reaches the old town and the sea " * 4]


@pytest.mark.parametrize(("model", "stages"), [
    ("minilm", ("minilm_tokenize", "minilm_encode", "minilm_pool")),
    ("minilm-fused", ("minilm-fused",)),
])
def test_back_to_back_requests_do_not_wait_in_the_queue(triton, model, stages):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    before = scrape(triton.metrics_url)
    took_ms = []
    for i in range(REQUESTS):
        tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[TEXTS[i % len(TEXTS)].encode()]], dtype=object))
        start = time.perf_counter()
        client.infer(model, [tensor])
        took_ms.append((time.perf_counter() - start) * 1000)
    delta = counted_since(triton.metrics_url, before, stages, REQUESTS)
    counted = {stage: delta[stage].success for stage in stages}
    assert counted == dict.fromkeys(stages, REQUESTS), f"requests counted per stage: {counted}"
    slow = sorted(round(ms) for ms in took_ms if ms >= SLOW_MS)
    queued_ms = sum(delta[stage].queue_us for stage in stages) / 1000
    assert not slow, (f"{len(slow)} of {REQUESTS} requests, sent one at a time, took {slow} ms; "
                      f"all of them spent {queued_ms:.0f} ms in Triton's queues")
