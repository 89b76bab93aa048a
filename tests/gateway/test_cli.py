"""`prensa gateway` refuses a default model Triton does not serve; `prensa serve` runs the gateway
beside Triton and stops both on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prensa.cli import app
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from typer.testing import CliRunner

from tests.conftest import free_port

pytestmark = pytest.mark.triton


def test_gateway_refuses_an_unserved_default_model(triton):
    result = CliRunner().invoke(app, ["gateway", "--triton-url", triton.grpc_url, "--repo", str(triton.options.repo),
                                      "--port", str(free_port()), "--default-model", "no-such-model"])
    assert result.exit_code == 1


def test_serve_starts_the_gateway_and_stops_on_sigterm(tmp_path, exports, direct):
    build_repository([ModelSource("bge-m3", exports["bge-m3"], Manifest.read(exports["bge-m3"]))], tmp_path / "repo",
                     ServingOptions())
    ports = [str(free_port()) for _ in range(4)]
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "prensa"), "serve", "--repo", str(tmp_path / "repo"), "--http-port", ports[0],
         "--grpc-port", ports[1], "--metrics-port", ports[2], "--gateway-port", ports[3]],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{ports[3]}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gateway not healthy in time"
            time.sleep(0.25)
        vector = httpx.post(f"{url}/embed", json={"inputs": "ok"}).json()[0]
        np.testing.assert_allclose(vector, direct("bge-m3", ["ok"])["dense"][0], atol=1e-6)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{ports[0]}/v2/health/live")  # Triton is gone too
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
