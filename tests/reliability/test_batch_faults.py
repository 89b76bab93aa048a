"""A batch job survives the death of what runs it: Triton SIGKILLed and started again mid-job (its
lines wait and go again, none lands in the error file), and the gateway SIGKILLed mid-job (the
next gateway on the same data directory takes the job over once the lease lapses). Each
custom_id is in the output once, with the answer an online request gets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from prensa.addresses import free_port
from prensa.gateway.jobs.store import JobStore
from prensa.gateway.settings import GatewaySettings
from prensa.triton.repo import ServingOptions
from tests.gateway.conftest import running_gateway
from tests.gateway.test_batches import finished, jsonl, lines_of
from tests.reliability.conftest import build_repo, own_triton, status_of, wait_until

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

LINES = [{"custom_id": f"n-{i}", "method": "POST", "url": "/v1/embeddings",
          "body": {"model": "minilm", "input": f"text number {i} " * 20}} for i in range(800)]


def started_batch(url: str) -> tuple[openai.OpenAI, str]:
    """A batch of LINES created on the gateway at `url`, once it has answered 50 of them."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    uploaded = client.files.create(file=("lines.jsonl", jsonl(LINES)), purpose="batch")
    batch_id = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch_id).request_counts.completed < 50:
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.05)
    return client, batch_id


def assert_every_line_once(client: openai.OpenAI, batch_id: str) -> None:
    batch = finished(client, batch_id, timeout_s=300)
    assert batch.status == "completed", batch
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (len(LINES), len(LINES), 0), counts
    assert batch.error_file_id is None
    output = lines_of(client, batch.output_file_id)
    assert set(output) == {line["custom_id"] for line in LINES}
    online = client.embeddings.create(model="minilm", input=LINES[-1]["body"]["input"]).data[0].embedding
    np.testing.assert_allclose(output[LINES[-1]["custom_id"]]["response"]["body"]["data"][0]["embedding"], online,
                               atol=1e-6)


def test_a_batch_rides_out_triton_killed_and_started_again(exports, tmp_path):
    repo = build_repo(exports, ["minilm"], tmp_path / "repo", ServingOptions())
    with own_triton(repo, tmp_path / "tritonserver.log") as triton:
        settings = GatewaySettings(triton_url=triton.grpc_url, repo=repo, data_dir=tmp_path / "data")
        with running_gateway(settings) as url:
            client, batch_id = started_batch(url)
            os.killpg(triton.process.pid, signal.SIGKILL)  # Triton and its stubs, lines in flight
            triton.process.wait()
            time.sleep(2)  # lines meet a gateway whose Triton is gone
            triton.start()
            triton.wait_ready()
            assert_every_line_once(client, batch_id)


def test_a_batch_is_taken_over_when_its_gateway_is_killed(triton, tmp_path):
    data = tmp_path / "data"
    settings = GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, data_dir=data)

    def gateway(port: int) -> subprocess.Popen:
        """`prensa gateway` on the shared data directory, its log (a line per batch line) in a file."""
        with (tmp_path / f"gateway-{port}.log").open("wb") as log:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "prensa"), "gateway", "--triton-url", settings.triton_url,
                 "--repo", str(settings.repo), "--port", str(port), "--data-dir", str(data)],
                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: process.poll() is None and status_of(f"{url}/health") == 200, 120, "gateway healthy")
        return process

    port = free_port()
    first = gateway(port)
    try:
        _, batch_id = started_batch(f"http://127.0.0.1:{port}")
    finally:
        first.send_signal(signal.SIGKILL)  # no shutdown: its lease stays until it lapses
        first.wait()
    stopped = JobStore(data).job(batch_id)
    assert stopped is not None and stopped.status == "in_progress" and stopped.completed < len(LINES), stopped
    port = free_port()
    second = gateway(port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert_every_line_once(client, batch_id)
    finally:
        second.terminate()
        second.wait(timeout=30)
