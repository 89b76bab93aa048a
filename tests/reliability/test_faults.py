"""Faults: Triton killed mid-load under `prensa serve` (the gateway answers 503 at once, /health turns
503, the supervisor restarts Triton and the same gateway serves again), a Triton that cannot come
back (`prensa serve` gives up and exits non-zero), and clients that hang up (their permits return).

Timeout chosen here: no request may take longer than `HANG_S` (2 s) while Triton is down; a
refused gRPC connection fails in milliseconds, so this is far above what it takes.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from prensa.addresses import free_port
from prensa.triton.repo import ServingOptions
from tests.reliability.conftest import (
    build_repo,
    listens_on_loopback_only,
    status_of,
    stop_tree,
    wait_until,
)

pytestmark = pytest.mark.triton
HANG_S = 2.0
PRENSA = str(Path(sys.executable).parent / "prensa")


class Serve:
    """`prensa serve` (Triton + gateway) as a child process on free loopback ports."""

    def __init__(self, repo: Path, log: Path, *flags: str) -> None:
        self.ports = [str(free_port()) for _ in range(4)]
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [PRENSA, "serve", "--repo", str(repo), "--http-port", self.ports[0], "--grpc-port", self.ports[1],
                 "--metrics-port", self.ports[2], "--gateway-port", self.ports[3], *flags],
                stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.ports[3]}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def triton_pid(self) -> int | None:
        children = psutil.Process(self.process.pid).children(recursive=True)
        return next((c.pid for c in children if c.name() == "tritonserver"), None)

    def wait_healthy(self, timeout_s: float) -> float:
        def healthy() -> bool:
            assert self.process.poll() is None, self.output()
            return status_of(f"{self.url}/health") == 200

        return wait_until(healthy, timeout_s, "gateway healthy")


def test_killed_triton_is_restarted_and_the_gateway_carries_on(tmp_path, exports):
    serve = Serve(build_repo(exports, ["bge-m3"], tmp_path / "repo", ServingOptions()), tmp_path / "serve.log",
                  "--restart-backoff", "0.5")
    try:
        serve.wait_healthy(120)
        first_pid = serve.triton_pid()
        assert listens_on_loopback_only(serve.process.pid) and listens_on_loopback_only(first_pid)
        text = "what happens to a request when Triton dies?"
        quiet = httpx.post(f"{serve.url}/embed", json={"inputs": text}, timeout=30).json()[0]
        outcomes: list[tuple[int, float, dict]] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=serve.url, timeout=30) as client:
                while not stop.is_set():
                    sent = time.perf_counter()
                    response = client.post("/embed", json={"inputs": text})
                    outcomes.append((response.status_code, time.perf_counter() - sent, response.json()))

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        psutil.Process(first_pid).send_signal(signal.SIGKILL)
        wait_until(lambda: status_of(f"{serve.url}/health") == 503, HANG_S, "/health 503 after the kill")
        wait_until(lambda: status_of(f"{serve.url}/health") == 200, 120, "/health 200 after the restart")
        time.sleep(0.5)
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        assert serve.triton_pid() not in (None, first_pid)
        statuses = {status for status, _, _ in outcomes}
        assert statuses == {200, 503}, statuses
        assert max(seconds for _, seconds, _ in outcomes) < HANG_S
        for status, _, body in outcomes:
            if status == 503:
                assert body["error_type"] == "Unhealthy"
            else:
                np.testing.assert_allclose(body[0], quiet, atol=1e-6)
        assert outcomes[-1][0] == 200, "the same gateway serves again"
        assert re.search(r"tritonserver died \(signal SIGKILL\).*restarting tritonserver in 0.5 s.*ready again",
                         serve.output(), re.DOTALL), serve.output()
        assert "prensa_triton_restarts_total 1.0" in httpx.get(f"{serve.url}/metrics").text
        assert stop_tree(serve.process) == 0
    finally:
        stop_tree(serve.process)


def test_serve_gives_up_after_quick_failures(tmp_path, exports):
    repo = build_repo(exports, ["bge-m3"], tmp_path / "repo", ServingOptions())
    serve = Serve(repo, tmp_path / "serve.log", "--restart-limit", "2", "--restart-backoff", "0.2")
    try:
        serve.wait_healthy(120)
        repo.rename(tmp_path / "gone")  # every restart now fails at once
        psutil.Process(serve.triton_pid()).send_signal(signal.SIGKILL)
        assert serve.process.wait(timeout=60) != 0
        output = serve.output()
        assert "restarting tritonserver in 0.2 s" in output and "restarting tritonserver in 0.4 s" in output
        assert "giving up: tritonserver failed 3 times in a row" in output, output
        assert status_of(f"{serve.url}/health") is None, "the gateway stops with it"
    finally:
        stop_tree(serve.process)


def send_and_drop(url: str, body: bytes) -> socket.socket:
    """A complete HTTP request on a raw socket, left open so the caller decides when to hang up."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def in_flight(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^prensa_inputs_in_flight (\S+)$", metrics, re.MULTILINE).group(1))


def test_disconnected_clients_free_their_permits(gateway_on):
    """Eight requests of 32 long texts take every permit and seconds of encoder time; once their
    clients hang up, the permits are back at once (not when Triton is done) and a full-size burst
    is admitted."""
    url = gateway_on(max_concurrent_requests=8 * 32)
    long_texts = [f"text {i} about the many rivers and bridges of the old city " * 20 for i in range(32)]
    body = httpx.Request("POST", "/", json={"inputs": long_texts}).read()
    sockets = [send_and_drop(url, body) for _ in range(8)]
    wait_until(lambda: in_flight(url) == 8 * 32, 10, "all permits taken")
    for sock in sockets:
        sock.close()
    wait_until(lambda: in_flight(url) == 0, 0.5, "permits returned after the hang-ups")

    async def burst() -> list[int]:
        short = [f"short text {i}" for i in range(32)]
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return [r.status_code for r in await asyncio.gather(*(client.post("/embed", json={"inputs": short})
                                                                  for _ in range(8)))]

    assert asyncio.run(burst()) == [200] * 8
