"""`prensa gateway --workers 2`, run as users run it, in front of the session's Triton: both workers
serve the one port, /metrics sums them, a killed worker is replaced while requests go on, and
SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from prensa.addresses import free_port
from tests.gateway.test_cli import wait_healthy

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def pool(triton, tmp_path_factory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    port = free_port()
    log = tmp_path_factory.mktemp("workers") / "gateway.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "prensa"), "gateway", "--triton-url", triton.grpc_url, "--repo",
             str(triton.options.repo), "--port", str(port), "--default-model", "minilm", "--access-log"],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PRENSA_WORKERS": "2"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url)
        yield process, url, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def workers_of(process: subprocess.Popen) -> list[psutil.Process]:
    """The gateway's live worker processes (multiprocessing's resource tracker is a child too, and
    a killed worker stays a zombie until the pool reaps it)."""
    workers = []
    for child in psutil.Process(process.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:  # gone since listed
            continue
    return workers


def embed_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(r'^te_request_count\{method="embed"\} ([0-9.e+]+)', text, re.M)
    return float(found[1]) if found else 0.0


def embed_on_new_connections(url: str, count: int) -> list[list[float]]:
    return [httpx.post(f"{url}/embed", json={"inputs": "dog"}, timeout=30).raise_for_status().json()[0]
            for _ in range(count)]


def test_two_workers_serve_one_port_and_their_metrics_add_up(pool, direct):
    process, url, _ = pool
    assert len(workers_of(process)) == 2
    before = embed_count(url)
    answers = embed_on_new_connections(url, 30)
    np.testing.assert_allclose(answers, direct("minilm", ["dog"] * 30)["dense"], atol=1e-5)
    assert embed_count(url) == before + 30  # every scrape, whichever worker answers it, sums both
    metrics = httpx.get(f"{url}/metrics").text
    assert re.search(r"^prensa_inputs_in_flight 0\.0$", metrics, re.M)
    assert re.search(r"^te_request_duration_count [1-9]", metrics, re.M)


def test_a_killed_worker_is_replaced_and_requests_go_on(pool):
    process, url, log = pool
    victim = workers_of(process)[0]
    counted = embed_count(url)
    victim.kill()
    deadline = time.monotonic() + 60
    while victim.pid in {w.pid for w in workers_of(process)} or len(workers_of(process)) < 2:
        assert time.monotonic() < deadline, "no worker replaced the killed one"
        time.sleep(0.2)
    for _ in range(20):  # some land on the surviving worker, then on its replacement once it listens
        assert httpx.post(f"{url}/embed", json={"inputs": "dog"}, timeout=30).status_code == 200
    wait_healthy(process, url)
    assert embed_count(url) >= counted + 20  # what the dead worker counted is still counted
    assert "ended with signal SIGKILL" in log.read_text()


def test_sigterm_stops_every_worker(pool):
    process, url, _ = pool
    workers = workers_of(process)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)
