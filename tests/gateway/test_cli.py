"""`prensa gateway` refuses a default model Triton does not serve; `prensa serve` and `prensa up` run
the gateway beside Triton with the gateway options (an API key, from a flag or PRENSA_API_KEY) and stop
both on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from prensa.addresses import free_port
from prensa.cli import app
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, ServingOptions, build_repository

pytestmark = pytest.mark.triton

KEY = "test-key"


def test_gateway_refuses_an_unserved_default_model(triton):
    result = CliRunner().invoke(app, ["gateway", "--triton-url", triton.grpc_url, "--repo", str(triton.options.repo),
                                      "--port", str(free_port()), "--default-model", "no-such-model"])
    assert result.exit_code == 1


def start(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, list[str]]:
    """`prensa COMMAND` on free ports (Triton's three, then the gateway's); stop it by PID."""
    ports = [str(free_port()) for _ in range(4)]
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "prensa"), *command, "--http-port", ports[0], "--grpc-port", ports[1],
         "--metrics-port", ports[2], "--gateway-port", ports[3]],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    return process, ports


def wait_healthy(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stderr.read().decode()
        try:
            if httpx.get(f"{url}/health").status_code == 200:  # open without the key
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "gateway not healthy in time"
        time.sleep(0.25)


def assert_the_key_is_required(url: str, direct: Callable[..., dict[str, np.ndarray]]) -> None:
    assert httpx.post(f"{url}/embed", json={"inputs": "ok"}).status_code == 401
    assert httpx.post(f"{url}/embed", json={"inputs": "ok"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = httpx.post(f"{url}/embed", json={"inputs": "ok"}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200
    np.testing.assert_allclose(answer.json()[0], direct("bge-m3", ["ok"])["dense"][0], atol=1e-6)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def check_keyed_server_and_stop(args: list[str], env: dict[str, str] | None, direct) -> list[str]:
    """Start `prensa ARGS`, check that its gateway wants the key, SIGTERM it; its ports."""
    process, ports = start(args, env=env)
    url = f"http://127.0.0.1:{ports[3]}"
    try:
        wait_healthy(process, url)
        assert_the_key_is_required(url, direct)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        stop(process)
    return ports


def test_serve_starts_the_gateway_with_its_options_and_stops_on_sigterm(tmp_path, exports, direct):
    build_repository([ModelSource("bge-m3", exports["bge-m3"], Manifest.read(exports["bge-m3"]))], tmp_path / "repo",
                     ServingOptions())
    ports = check_keyed_server_and_stop(["serve", "--repo", str(tmp_path / "repo"), "--api-key", KEY], None, direct)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{ports[0]}/v2/health/live")  # Triton is gone too


def test_up_reads_the_gateway_options_from_the_environment(tmp_path, exports, direct):
    """`up` reuses `--models-dir/<name>` when it holds an export, so the source is never read."""
    check_keyed_server_and_stop(["up", "--models-dir", str(exports["bge-m3"].parent), "--model", "bge-m3=unused",
                                 "--repo", str(tmp_path / "repo")], {"PRENSA_API_KEY": KEY}, direct)
