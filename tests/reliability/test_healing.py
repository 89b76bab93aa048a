"""A stage whose Python-backend stub dies: `prensa serve` reloads that model alone while the others
keep serving, `/health` names it meanwhile and its requests get 503 Unhealthy (never a wrong or a
424 answer) saying when to come back (`Retry-After`); and the gateway's model list survives the outage.

A request that met the dead stub is tried again by the gateway, so it may well be answered
correctly rather than with 503. Target: a request sent within `HEAL_S` (10 s) of the kill, after
the last failure, is answered correctly.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as triton_http

from prensa.gateway.settings import GatewaySettings
from prensa.triton.repo import ServingOptions
from tests.gateway.conftest import running_gateway
from tests.log_records import Records, records_of
from tests.reliability.conftest import build_repo, own_triton, status_of, stop_tree, wait_until
from tests.reliability.test_faults import Serve

pytestmark = pytest.mark.triton
HEAL_S = 10.0
TEXT = "which bridge crosses the river by the old mill?"


@pytest.fixture
def model_list_log() -> Iterator[Records]:
    """The gateway's model-list lines (the records carrying those fields)."""
    def about_the_list(record: logging.LogRecord) -> bool:
        return bool({"models", "added", "down", "back"} & set(getattr(record, "fields", {})))

    with records_of("prensa.gateway", about_the_list) as handler:
        yield handler


def kill_stub(triton_pid: int, model: str) -> int:
    """SIGKILL the Python-backend stub serving `model`; its pid."""
    stub = next(p for p in psutil.Process(triton_pid).children() if f"/{model}/1/" in " ".join(p.cmdline()))
    stub.send_signal(signal.SIGKILL)
    return stub.pid


class Steady:
    """A client sending one request over and over, keeping (sent, status, body, Retry-After) of each."""

    def __init__(self, send: Callable[[httpx.Client], httpx.Response], base_url: str) -> None:
        self.outcomes: list[tuple[float, int, object, str | None]] = []
        self._stop = threading.Event()

        def run() -> None:
            with httpx.Client(base_url=base_url, timeout=30) as client:
                while not self._stop.is_set():
                    sent = time.monotonic()
                    response = send(client)
                    self.outcomes.append((sent, response.status_code, response.json() if response.content else None,
                                          response.headers.get("retry-after")))
                    time.sleep(0.02)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[float, int, object, str | None]]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.outcomes


def test_a_killed_stub_is_reloaded_while_other_models_serve(tmp_path, exports):
    repo = build_repo(exports, ["minilm", "bge-m3"], tmp_path / "repo", ServingOptions())
    serve = Serve(repo, tmp_path / "serve.log", "--default-model", "minilm")
    try:
        serve.wait_healthy(120)
        quiet = httpx.post(f"{serve.url}/embed", json={"inputs": TEXT}, timeout=30).json()[0]
        quiet_m3 = httpx.post(f"{serve.url}/embed?model=bge-m3", json={"inputs": TEXT}, timeout=30).json()[0]
        minilm = Steady(lambda c: c.post("/embed", json={"inputs": TEXT}), serve.url)
        m3 = Steady(lambda c: c.post("/embed?model=bge-m3", json={"inputs": TEXT}), serve.url)
        health = Steady(lambda c: c.get("/health"), serve.url)
        time.sleep(0.5)
        killed_at = time.monotonic()
        kill_stub(serve.triton_pid(), "minilm_encode")
        wait_until(lambda: "minilm_encode is serving again" in serve.output(), 60, "the reload")
        time.sleep(1.0)
        outcomes, outcomes_m3, checks = minilm.stop(), m3.stop(), health.stop()

        assert 'prensa_stage_reloads_total{model="minilm_encode"} 1.0' in httpx.get(f"{serve.url}/metrics").text
        failed = [sent for sent, status, _, _ in outcomes if status != 200 and sent >= killed_at]
        healed_s = min(sent for sent, status, _, _ in outcomes
                       if status == 200 and sent > max(failed, default=killed_at)) - killed_at
        print(f"\nstub of minilm_encode killed: a request sent {healed_s:.1f} s after the kill was answered "
              f"({len(failed)} requests answered 503 meanwhile)")
        assert healed_s < HEAL_S
        for _, status, body, retry_after in outcomes:
            assert status in (200, 503), (status, body)
            if status == 503:  # says when to come back: the first outage of a model, about a reload
                assert body["error_type"] == "Unhealthy" and retry_after is not None, (body, retry_after)
                assert 1 <= int(retry_after) <= 3 and body["error"].endswith(f"; retry in {retry_after} s"), body
            else:
                np.testing.assert_allclose(body[0], quiet, atol=1e-6)
        assert {status for _, status, _, _ in outcomes_m3} == {200}, "the other model kept serving"
        for _, _, body, _ in outcomes_m3:
            np.testing.assert_allclose(body[0], quiet_m3, atol=1e-6)
        unhealthy = [body["error"] for _, status, body, _ in checks if status == 503]
        assert unhealthy and all("minilm" in e and "bge-m3" not in e for e in unhealthy), unhealthy
        assert checks[-1][1] == 200
        assert serve.process.poll() is None and stop_tree(serve.process) == 0
    finally:
        stop_tree(serve.process)


def test_the_model_list_survives_an_outage(tmp_path, exports, model_list_log):
    """No supervisor here: the stub dies and its model is unloaded (what `prensa serve` does first),
    so Triton reports it down for as long as the test wants. A refresh meanwhile keeps it; a model
    unloaded on purpose goes. /metrics and the log say each change."""
    changes = model_list_log
    repo = build_repo(exports, ["minilm", "bge-m3"], tmp_path / "repo", ServingOptions())
    with own_triton(repo, tmp_path / "triton.log") as triton:
        settings = GatewaySettings(triton_url=triton.grpc_url, repo=repo, default_model="minilm")
        control = triton_http.InferenceServerClient(triton.http_url)
        with running_gateway(settings) as url, httpx.Client(base_url=url, timeout=30) as http:
            quiet = http.post("/embed", json={"inputs": TEXT}).json()[0]
            kill_stub(triton.process.pid, "minilm_encode")
            control.unload_model("minilm_encode")
            wait_until(lambda: status_of(f"{url}/health") == 503, 10, "/health 503")
            assert "minilm" in http.get("/health").json()["error"]
            metrics = http.get("/metrics").text
            assert 'prensa_model_ready{model="minilm"} 0.0' in metrics and 'prensa_model_ready{model="bge-m3"} 1.0' in metrics
            time.sleep(1.1)  # past the registry's refresh interval
            assert http.post("/embed?model=nope", json={"inputs": TEXT}).status_code == 404  # re-reads Triton
            assert "minilm" in {m["id"] for m in http.get("/v1/models").json()["data"]}
            down = http.post("/embed", json={"inputs": TEXT})
            assert down.status_code == 503 and down.json()["error_type"] == "Unhealthy", down.text
            control.load_model("minilm_encode")
            wait_until(lambda: status_of(f"{url}/health") == 200, 30, "/health 200 after the reload")
            time.sleep(1.1)  # past the refresh interval: the next request's refresh says it is back
            np.testing.assert_allclose(http.post("/embed", json={"inputs": TEXT}).json()[0], quiet, atol=1e-6)
            assert 'prensa_model_ready{model="minilm"} 1.0' in http.get("/metrics").text

            control.unload_model("bge-m3")  # on purpose: its stages stay loaded
            time.sleep(1.1)
            assert http.post("/embed?model=nope", json={"inputs": TEXT}).status_code == 404
            assert "bge-m3" not in {m["id"] for m in http.get("/v1/models").json()["data"]}
            assert http.get("/health").status_code == 200
            assert "bge-m3" not in http.get("/metrics").text.split("prensa_model_ready", 1)[1]
        control.close()
    said = [r.getMessage() for r in changes.records]  # each change once, in order, nothing for a refresh without one
    assert said == ["serving bge-m3 (m3), minilm (embed)", "minilm not ready in Triton for now; kept",
                    "minilm ready again", "model list changed: added none; removed bge-m3"], said


def test_without_model_control_a_dead_stub_restarts_triton(tmp_path, exports):
    repo = build_repo(exports, ["minilm"], tmp_path / "repo", ServingOptions())
    serve = Serve(repo, tmp_path / "serve.log", "--model-control-mode", "none", "--restart-backoff", "0.2")
    try:
        serve.wait_healthy(120)
        quiet = httpx.post(f"{serve.url}/embed", json={"inputs": TEXT}, timeout=30).json()[0]
        first = serve.triton_pid()
        killed_at = time.monotonic()
        kill_stub(first, "minilm_encode")
        wait_until(lambda: status_of(f"{serve.url}/health") == 503, 5, "/health 503")
        serve.wait_healthy(60)
        healed_s = time.monotonic() - killed_at
        print(f"\nstub killed under --model-control-mode none: Triton restarted, healthy in {healed_s:.1f} s")
        assert healed_s < HEAL_S
        assert serve.triton_pid() not in (None, first)
        assert "the stub of minilm_encode_0_0 died; restarting tritonserver" in serve.output()
        np.testing.assert_allclose(httpx.post(f"{serve.url}/embed", json={"inputs": TEXT}, timeout=30).json()[0],
                                   quiet, atol=1e-6)
        assert stop_tree(serve.process) == 0
    finally:
        stop_tree(serve.process)
