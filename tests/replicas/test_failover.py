"""Two real Tritons behind one gateway: least-outstanding spreading, a replica killed mid-load
loses no admitted request, and it is taken back once it is ready again."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from prensa.addresses import free_port
from prensa.gateway.settings import GatewaySettings
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.metrics import scrape
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton
TEXTS = [f"replica test sentence number {i} " + "word " * (i % 40) for i in range(160)]


def start_triton(repo, log) -> TritonProcess:
    triton = TritonProcess(TritonOptions(repo, ports=TritonPorts(free_port(), free_port(), free_port())), log_path=log)
    triton.start()
    triton.wait_ready()
    return triton


def encoder_requests(triton: TritonProcess) -> float:
    return scrape(triton.metrics_url)["bge-m3_encode"].success


def test_replica_killed_mid_load_loses_nothing_and_comes_back(tmp_path, exports):
    repo = tmp_path / "repo"
    build_repository([ModelSource("bge-m3", exports["bge-m3"], Manifest.read(exports["bge-m3"]))], repo,
                     ServingOptions())
    first, second = start_triton(repo, tmp_path / "a.log"), start_triton(repo, tmp_path / "b.log")
    try:
        settings = GatewaySettings(triton_url=f"{first.grpc_url},{second.grpc_url}", repo=repo, triton_timeout_s=10)
        with running_gateway(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
            quiet = np.asarray(http.post("/embed", json={"inputs": TEXTS[:8]}).json())

            def embed(text: str) -> tuple[int, list]:
                response = http.post("/embed", json={"inputs": text})
                return response.status_code, response.json()

            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(embed, t) for t in TEXTS]
                time.sleep(1.0)  # load is flowing through both replicas
                second.process.send_signal(signal.SIGKILL)
                results = [f.result() for f in futures]
            assert [status for status, _ in results] == [200] * len(TEXTS), "an admitted request was lost"
            np.testing.assert_allclose(np.asarray([body[0] for _, body in results[:8]]), quiet, atol=1e-5)
            assert http.get("/health").status_code == 200  # one replica is enough to answer

            served_before = encoder_requests(first)
            restarted = TritonProcess(TritonOptions(repo, ports=second.options.ports), log_path=tmp_path / "b2.log")
            restarted.start()
            restarted.wait_ready()
            try:
                time.sleep(2.5)  # a probe interval or two
                with ThreadPoolExecutor(8) as pool:
                    assert all(s == 200 for s, _ in pool.map(embed, TEXTS[:40]))
                assert encoder_requests(restarted) > 0, "the restarted replica got no traffic back"
                assert encoder_requests(first) - served_before < 40, "all traffic stayed on one replica"
            finally:
                restarted.stop()
    finally:
        first.stop()
        second.stop()
