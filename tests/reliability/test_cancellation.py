"""Clients that hang up: Triton does not compute what they asked for.

A thousand clients each send a request of long texts and hang up a second later, as clients that
time out do. Once the gateway has let them go, Triton's queues empty within seconds and its
encoder computes at most what it held then: the fused model's running batch (it skips the rest:
Triton drops a cancelled request from the queue, the stage checks the ones it was already
handed) or an ensemble's `TritonWindow` (Triton 2.51 never cancels an ensemble step it has
already queued, so the gateway keeps that queue short). A steady client gets the vector it got
before the storm all along, and in bounded time once the storm is gone.

Below, the same rules without Triton: the window's order and bound, and the encoder skipping the
rows of a request that is cancelled between its sub-batches.

Margins chosen here, for a busy 2-core machine: times are multiples of one batch computed alone,
measured first; token bounds allow one request of rows more than the batches in Triton's hands.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from prensa.gateway.core.dispatch import SPARE_CALLS
from prensa.gateway.core.limits import TritonWindow
from prensa.gateway.settings import GatewaySettings
from prensa.stages import contract, load_stage
from prensa.triton.metrics import TOKEN_COUNTERS_LAG_S, difference, scrape
from prensa.triton.repo import Pipeline, ServingOptions
from tests.gateway.conftest import running_gateway
from tests.reliability.conftest import build_repo, own_triton, wait_until
from tests.reliability.test_faults import in_flight, send_and_drop

encode = load_stage("encode")
WAVES, OPEN = 5, 200  # clients that hang up: waves of OPEN, each connected for HOLD_S
HOLD_S = 1.0  # long enough for Triton to take a wave's requests into its queues
ROWS = 16  # texts per request
STORM_TEXTS = [f"text {i} about the many rivers and bridges of the old city, its towers and its harbour " * 5
               for i in range(ROWS)]
STEADY_TEXT = "what does the steady client ask about?"
BATCH = ServingOptions().max_batch_size
PENDING = re.compile(r'^nv_inference_pending_request_count\{model="([^"]+)",version="\d+"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class Layout:
    model: str
    encoder: str
    stages: tuple[str, ...]
    stale_rows: int  # what the encoder may still compute once the gateway has let the clients go


LAYOUTS = [
    Layout("minilm-fused", "minilm-fused", ("minilm-fused",), BATCH + ROWS),
    Layout("minilm", "minilm_encode", ("minilm", "minilm_tokenize", "minilm_encode", "minilm_pool"),
           (1 + SPARE_CALLS) * BATCH + ROWS),  # one encoder instance
]


def pending(metrics_url: str) -> dict[str, float]:
    """Requests each model has queued or running, from Triton's metrics port."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:  # noqa: S310 - our own Triton
        return {model: float(value) for model, value in PENDING.findall(response.read().decode())}


class Steady(threading.Thread):
    """One client asking the same question every 20 ms: (sent at, seconds, status, vector) each time."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.answers: list[tuple[float, float, int, list[float] | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                response = client.post("/embed", json={"inputs": STEADY_TEXT, "model": self.model})
                vector = response.json()[0] if response.status_code == 200 else None
                self.answers.append((sent, time.monotonic() - sent, response.status_code, vector))
                time.sleep(0.02)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory, exports):
    """minilm as an ensemble and as `minilm-fused`, in a Triton of this module's own: a storm that
    leaves work behind must not slow down the rest of the suite."""
    repo = tmp_path_factory.mktemp("cancel-repo")
    build_repo(exports, ["minilm"], repo, ServingOptions())
    build_repo({"minilm-fused": exports["minilm"]}, ["minilm-fused"], repo, ServingOptions(pipeline=Pipeline.FUSED))
    with own_triton(repo, repo.parent / "tritonserver.log") as server:
        yield server


@pytest.mark.triton
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.model for layout in LAYOUTS])
def test_hung_up_requests_are_not_computed(own_server, exports, layout):
    triton = own_server
    tokenizer = Tokenizer.from_file(str(exports["minilm"] / "tokenizer.json"))
    row_tokens = max(len(tokenizer.encode(text).ids) for text in STORM_TEXTS)
    steady_tokens = len(tokenizer.encode(STEADY_TEXT).ids)
    body = httpx.Request("POST", "/", json={"inputs": STORM_TEXTS, "model": layout.model}).read()
    settings = GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, max_concurrent_requests=100_000)
    with running_gateway(settings) as url:
        reference = httpx.post(f"{url}/embed", json={"inputs": STEADY_TEXT, "model": layout.model}, timeout=60).json()[0]
        started = time.monotonic()
        assert httpx.post(f"{url}/embed", content=body, headers={"content-type": "application/json"},
                          timeout=60).status_code == 200
        batch_s = (time.monotonic() - started) * BATCH / ROWS  # one full batch of storm rows, computed alone

        steady = Steady(url, layout.model)
        steady.start()
        for _ in range(WAVES):
            connected = [send_and_drop(url, body) for _ in range(OPEN)]
            time.sleep(HOLD_S)
            for sock in connected:
                sock.close()
        wait_until(lambda: in_flight(url) <= 1, 10, "the gateway letting the clients go")  # 1: the steady client
        gone = time.monotonic()
        time.sleep(TOKEN_COUNTERS_LAG_S)  # what was computed before the gateway let go is counted before
        before = scrape(triton.metrics_url)

        drain_limit = 2.0 + 3 * batch_s * (layout.stale_rows / BATCH + 1)
        drained = wait_until(lambda: not any(pending(triton.metrics_url).get(m) for m in layout.stages),
                             drain_limit, f"{layout.model}'s queues empty (one batch alone: {batch_s:.2f} s)")
        time.sleep(TOKEN_COUNTERS_LAG_S)
        computed = difference(scrape(triton.metrics_url), before)[layout.encoder].real_tokens
        steady_after = sum(1 for sent, *_ in steady.answers if sent >= gone - 1.0)
        wait_until(lambda: sum(sent > gone + drained for sent, *_ in steady.answers) >= 5, drain_limit,
                   "five answers to the steady client once the queues are empty")
        steady.stop.set()
        steady.join(timeout=300)

    assert computed <= layout.stale_rows * row_tokens + (steady_after + 1) * steady_tokens, (
        f"{computed:.0f} tokens computed after the clients were gone ({computed / row_tokens:.0f} storm rows); "
        f"Triton may hold {layout.stale_rows} rows then")
    assert {status for _, _, status, _ in steady.answers} == {200}
    for _, _, _, vector in steady.answers:
        np.testing.assert_allclose(vector, reference, atol=1e-5)
    during = max((sent + seconds for sent, seconds, _, _ in steady.answers if sent < gone), default=gone)
    assert during - gone < drain_limit, f"a question asked during the storm waited until {during - gone:.2f} s after it"
    late = max((seconds for sent, seconds, _, _ in steady.answers if sent >= gone), default=0.0)
    assert late < drain_limit, f"the steady client waited {late:.2f} s once the storm was gone"


def test_window_bounds_rows_in_triton_and_admits_in_order():
    async def scenario() -> tuple[list[int], list[str]]:
        window, gates = TritonWindow(4), {name: asyncio.Event() for name in "abcd"}
        seen, order = [], []

        async def call(name: str) -> str:
            order.append(name)
            seen.append(window.in_triton)
            await gates[name].wait()
            return name

        tasks = [asyncio.ensure_future(window.run(rows, lambda n=name: call(n)))
                 for name, rows in zip("abcd", (2, 2, 3, 1))]
        await asyncio.sleep(0.01)
        assert order == ["a", "b"], "c (3 rows) waits for room, d waits behind it"
        gates["a"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b"], "two rows free are not room for c"
        gates["b"].set()
        await asyncio.sleep(0.01)
        for gate in gates.values():
            gate.set()
        return [await t for t in tasks], [*seen, window.in_triton]

    results, seen = asyncio.run(scenario())
    assert results == ["a", "b", "c", "d"]
    assert max(seen) <= 4 and seen[-1] == 0


def test_window_keeps_the_rows_of_a_cancelled_caller_until_triton_answers():
    async def scenario() -> None:
        window, answer = TritonWindow(2), asyncio.Event()
        started = []

        async def call(name: str) -> str:
            started.append(name)
            if name == "in triton":
                await answer.wait()
            return name

        running = asyncio.ensure_future(window.run(2, lambda: call("in triton")))
        waiting = asyncio.ensure_future(window.run(1, lambda: call("waiting")))
        after = asyncio.ensure_future(window.run(2, lambda: call("after")))
        await asyncio.sleep(0.01)
        waiting.cancel()  # its client hangs up before Triton has seen it
        running.cancel()  # and this one's while Triton computes it
        await asyncio.sleep(0.01)
        assert started == ["in triton"] and window.in_triton == 2, "Triton still computes the first call"
        answer.set()
        assert await after == "after"
        assert started == ["in triton", "after"] and window.in_triton == 0
        assert waiting.cancelled() and running.cancelled()

    asyncio.run(scenario())


def test_a_call_that_waits_past_the_queue_time_leaves_overloaded():
    """--max-queue-time: a call that finds no room in Triton within it is refused at that moment (429,
    RESOURCE_EXHAUSTED), leaves the queue without taking rows, and the calls behind it go on."""
    from prensa.gateway.errors import ErrorKind, GatewayError

    async def scenario() -> None:
        window, answer = TritonWindow(2, max_wait_s=0.2), asyncio.Event()

        async def call(name: str) -> str:
            if name == "long":
                await answer.wait()
            return name

        running = asyncio.ensure_future(window.run(2, lambda: call("long")))
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        with pytest.raises(GatewayError) as refused:
            await window.run(1, lambda: call("late"))
        waited = asyncio.get_running_loop().time() - started
        assert refused.value.kind is ErrorKind.OVERLOADED and "--max-queue-time" in refused.value.message
        assert 0.15 < waited < 1.0 and window.in_triton == 2 and not window.waiting
        next_call = asyncio.ensure_future(window.run(1, lambda: call("next")))
        answer.set()
        assert await running == "long" and await next_call == "next" and window.in_triton == 0

    asyncio.run(scenario())


class EchoSession:
    """An onnxruntime stand-in that echoes ids as the hidden state and records each sub-batch's rows."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in (contract.INPUT_IDS, contract.ATTENTION_MASK)]

    def get_outputs(self):
        return [type("O", (), {"name": contract.LAST_HIDDEN_STATE})()]

    def run(self, names, feed, options=None):
        self.calls.append(feed[contract.INPUT_IDS].shape[0])
        return [feed[contract.INPUT_IDS][..., None].astype(np.float32)]


def token_request(lengths: list[int]) -> dict[str, np.ndarray]:
    width = max(lengths)
    mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return {contract.INPUT_IDS: mask * 7, contract.ATTENTION_MASK: mask, contract.TOKEN_TYPE_IDS: np.zeros_like(mask)}


def test_encoder_skips_the_rows_left_of_a_request_cancelled_between_sub_batches():
    session = EchoSession()
    encoder = encode.TokenBudgetEncoder(session, pad_id=0, max_batch_tokens=64, length_ratio=1.25, max_rows=8,
                                        per_token_outputs={contract.LAST_HIDDEN_STATE})
    requests = [token_request([4, 4, 30, 30]), token_request([4, 30])]  # sub-batches: the 4s, then the 30s
    asked = []

    def cancelled(index: int) -> bool:
        asked.append(index)
        return index == 0 and len(session.calls) > 0  # request 0's client hangs up after the first sub-batch

    results = encoder.encode_each(requests, cancelled)
    assert isinstance(results[0], contract.Cancelled)
    assert results[1][contract.LAST_HIDDEN_STATE].shape == (2, 30, 1)
    assert session.calls == [3, 1], "the second sub-batch computes request 1's row alone"
    assert asked.count(0) == 2


def test_cancel_check_asks_triton_at_most_once_an_interval():
    class Request:
        def __init__(self, cancel_after: int) -> None:
            self.asked, self.cancel_after = 0, cancel_after

        def is_cancelled(self) -> bool:
            self.asked += 1
            return self.asked > self.cancel_after

    now = [0.0]
    requests = [Request(cancel_after=1), Request(cancel_after=100)]
    check = contract.CancelCheck(requests, interval_s=0.05, clock=lambda: now[0])
    assert [check(0), check(0), check(1)] == [False, False, False]
    assert [r.asked for r in requests] == [1, 1], "asked again within the interval: answered from the last answer"
    now[0] = 0.06
    assert check(0) and check(0), "a cancelled request stays cancelled"
    assert requests[0].asked == 2
