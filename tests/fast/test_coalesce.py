"""Concurrent requests merged into one Triton call get exactly their own rows, errors and
truncation: the `Coalescer` against a fake model, then mixed concurrent requests through the
gateway (different routes, outputs, truncation and models at once) against the same requests
sent one at a time."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from prensa.gateway.core.coalesce import Coalescer, split_rows
from prensa.gateway.core.dispatch import ModelDispatch
from prensa.gateway.core.request_context import Priority
from prensa.gateway.errors import ErrorKind, GatewayError
from tests.fast.conftest import gateway_client


class FakeModel:
    """Answers each text with its length; `gate` holds every call until released; "poison" fails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()

    async def send(self, texts, pairs, request_id, priority=Priority.ONLINE, client=""):
        self.calls.append(list(texts))
        await self.gate.wait()
        if "poison" in texts:
            raise GatewayError(ErrorKind.BACKEND, "the encoder failed")
        if "down" in texts:
            raise GatewayError(ErrorKind.UNHEALTHY, "Triton is down")
        rows = np.asarray([[len(t)] + ([len(p)] if pairs else []) for t, p in zip(texts, pairs or texts)])
        return {"lengths": rows}


def run(coroutine):
    return asyncio.run(coroutine)


def test_split_rows_gives_each_caller_its_rows():
    merged = {"a": np.arange(10).reshape(5, 2), "b": np.arange(5)}
    parts = split_rows(merged, [2, 0, 3])
    assert [p["b"].tolist() for p in parts] == [[0, 1], [], [2, 3, 4]]
    assert parts[2]["a"].tolist() == [[4, 5], [6, 7], [8, 9]]


def test_a_call_not_sent_within_the_queue_time_leaves_overloaded():
    """--max-queue-time: a call still waiting for a place when it passes is refused, takes nothing,
    and the calls sent before it are answered."""
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=8, max_wait_s=0.1)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        try:
            await coalescer.call(["late"], None, "r2")
        except GatewayError as error:
            refused = error
        assert refused.kind is ErrorKind.OVERLOADED and "--max-queue-time" in refused.message
        assert not any(coalescer.waiting.values()) and model.calls == [["a"]]
        model.gate.set()
        assert (await first)["lengths"].tolist() == [[1]]

    run(scenario())


def test_a_lone_call_goes_at_once_and_waiting_calls_leave_together():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=8)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        assert model.calls == [["a"]]  # sent before anything else happened
        later = [asyncio.ensure_future(coalescer.call([t * 2, t * 3], None, f"r{t}")) for t in "xyz"]
        await asyncio.sleep(0)
        assert len(model.calls) == 1  # they wait while the only place is taken
        model.gate.set()
        answers = await asyncio.gather(first, *later)
        assert model.calls[1] == ["xx", "xxx", "yy", "yyy", "zz", "zzz"]  # one call, in arrival order
        assert [a["lengths"].ravel().tolist() for a in answers] == [[1], [2, 3], [2, 3], [2, 3]]

    run(scenario())


def test_merged_calls_respect_max_rows_and_keep_pairs():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=3)
        first = asyncio.ensure_future(coalescer.call(["q"], ["p"], "r0"))
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(coalescer.call(["q" * n, "q"], ["p" * n, "pp"], f"r{n}")) for n in (2, 3, 4)]
        await asyncio.sleep(0)
        model.gate.set()
        answers = await asyncio.gather(first, *later)
        assert all(len(call) <= 3 for call in model.calls) and len(model.calls) == 4
        assert answers[2]["lengths"].tolist() == [[3, 3], [1, 2]]

    run(scenario())


def test_a_bad_input_fails_only_its_own_request():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=16)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        good = asyncio.ensure_future(coalescer.call(["good"], None, "r2"))
        bad = asyncio.ensure_future(coalescer.call(["poison"], None, "r3"))
        also_good = asyncio.ensure_future(coalescer.call(["fine", "ok"], None, "r4"))
        await asyncio.sleep(0)
        model.gate.set()
        results = await asyncio.gather(first, good, bad, also_good, return_exceptions=True)
        assert results[1]["lengths"].ravel().tolist() == [4]
        assert isinstance(results[2], GatewayError) and results[2].kind is ErrorKind.BACKEND
        assert results[3]["lengths"].ravel().tolist() == [4, 2]
        assert ["good", "poison", "fine", "ok"] in model.calls  # tried merged first, then one by one
        assert ["poison"] in model.calls and ["good"] in model.calls

    run(scenario())


def test_an_unreachable_triton_fails_every_merged_request_without_retries():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=16)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        merged = [asyncio.ensure_future(coalescer.call([t], None, t)) for t in ("down", "b", "c")]
        await asyncio.sleep(0)
        model.gate.set()
        results = await asyncio.gather(first, *merged, return_exceptions=True)
        assert all(isinstance(r, GatewayError) and r.kind is ErrorKind.UNHEALTHY for r in results[1:])
        assert len(model.calls) == 2

    run(scenario())


def test_a_caller_that_leaves_while_waiting_is_never_sent():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=16)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        gone = asyncio.ensure_future(coalescer.call(["gone"], None, "r2"))
        stays = asyncio.ensure_future(coalescer.call(["stays"], None, "r3"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        model.gate.set()
        await first
        assert (await stays)["lengths"].ravel().tolist() == [5]
        assert model.calls == [["a"], ["stays"]] and coalescer.in_triton == 0 and not any(coalescer.waiting.values())

    run(scenario())


# --- through the gateway -------------------------------------------------------------------------------------------

REQUESTS = [
    ("/embed", {"inputs": "the quick brown fox"}),
    ("/embed", {"inputs": ["berlin is the capital of germany", "paris"], "normalize": False}),
    ("/embed", {"inputs": "the lazy dog " * 12, "truncate": True}),  # past the max length: cut by Triton
    ("/embed", {"inputs": "the lazy dog " * 12, "truncate": True, "truncation_direction": "left"}),
    ("/embed", {"inputs": "the lazy dog " * 12, "truncate": False}),  # 413-free 422: too long
    ("/embed", {"inputs": ["dense vectors", "sparse vectors", "query"], "dimensions": 4}),
    ("/embed", {"inputs": "capital of france", "model": "m3"}),
    ("/embed_sparse", {"inputs": ["capital of france", "the river"], "model": "m3"}),
    ("/embed_sparse", {"inputs": "quick brown fox", "model": "splade"}),
    ("/embed_all", {"inputs": ["the city"], "model": "m3"}),
    ("/rerank", {"query": "capital of france", "texts": ["paris is the capital of france", "the dog"]}),
    ("/rerank", {"query": "dog", "texts": ["the lazy dog", "berlin"], "raw_scores": True}),
    ("/predict", {"inputs": "good weather today", "model": "classify"}),
    ("/v1/embeddings", {"input": ["happy", "sad"], "model": "embed"}),
    ("/embed", {"inputs": [[2, 20, 21, 3]]}),  # token ids: the token path, never merged
]


def answer(client, path: str, body: dict) -> tuple[int, object]:
    response = client.post(path, json=body)
    payload = response.json()
    if isinstance(payload, dict):
        payload.pop("request_id", None)
    return response.status_code, payload


def close(got: object, expected: object) -> bool:
    """Equal JSON, floats within 1e-6 (a batch's neighbours may move the last bits)."""
    if isinstance(expected, float):
        return isinstance(got, (int, float)) and abs(got - expected) <= 1e-6
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(close, got, expected))
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(close(got[k], expected[k]) for k in expected)
    return got == expected


def test_mixed_concurrent_requests_get_what_they_get_alone(settings, monkeypatch):
    sent: list[int] = []
    original = ModelDispatch.send

    async def counted(self, texts, pairs, outputs, request_id, priority, client):
        sent.append(len(texts))
        await asyncio.sleep(0.02)  # a busy model: calls pile up behind the ones in flight
        return await original(self, texts, pairs, outputs, request_id, priority, client)

    monkeypatch.setattr(ModelDispatch, "send", counted)
    with gateway_client(replace(settings, coalesce_requests=False)) as client:
        alone = [answer(client, path, body) for path, body in REQUESTS]
    assert {status for status, _ in alone} == {200, 422}
    calls_alone, rounds, copies = len(sent), 3, 4
    sent.clear()
    with gateway_client(settings) as client, ThreadPoolExecutor(16) as pool:
        for _ in range(rounds):
            together = list(pool.map(lambda request: answer(client, *request), REQUESTS * copies))
            for index, got in enumerate(together):
                request, expected = REQUESTS[index % len(REQUESTS)], alone[index % len(REQUESTS)]
                assert got[0] == expected[0] and close(got[1], expected[1]), (request, got, expected)
    assert len(sent) < rounds * copies * calls_alone, "no call was merged"


def test_a_merged_call_whose_callers_all_left_is_cancelled():
    async def scenario():
        released, calls = asyncio.Event(), []

        async def send(texts, pairs, request_id, priority, client):
            calls.append(list(texts))
            if len(calls) == 1:
                await released.wait()
            else:
                await asyncio.Event().wait()  # a merged call Triton is still computing
            return {"lengths": np.zeros((len(texts), 1))}

        coalescer = Coalescer(send, max_calls=1, max_rows=16)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        merged = [asyncio.ensure_future(coalescer.call([t], None, t)) for t in ("b", "c")]
        await asyncio.sleep(0)
        released.set()
        await first
        await asyncio.sleep(0)
        assert calls[-1] == ["b", "c"]
        (sent,) = coalescer._calls
        merged[0].cancel()
        await asyncio.sleep(0)
        assert not sent.done()  # c still waits for it
        merged[1].cancel()
        for _ in range(3):  # the callers leave, the call is cancelled, its done callback runs
            await asyncio.sleep(0)
        assert sent.cancelled() and all(m.cancelled() for m in merged) and coalescer.in_triton == 0

    run(scenario())


def test_a_merged_call_cancelled_before_it_ran_frees_its_place():
    """Callers that all hang up the moment their merged call is made: its task is cancelled before
    it starts, and the place it held in Triton must come back, or every later call would wait."""
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=16)
        first = asyncio.ensure_future(coalescer.call(["a"], None, "r1"))
        await asyncio.sleep(0)
        merged = [asyncio.ensure_future(coalescer.call([t], None, t)) for t in ("b", "c")]
        await asyncio.sleep(0)
        # In one turn of the loop: the first call returns and hands its place to b and c's merged
        # call, whose task is queued after both callers' cancellations, as in a hang-up storm.
        model.gate.set()
        for caller in merged:
            caller.cancel()
        await first
        for _ in range(3):
            await asyncio.sleep(0)
        assert all(caller.cancelled() for caller in merged)
        assert coalescer.in_triton == 0 and not coalescer._calls
        later = await asyncio.wait_for(coalescer.call(["later"], None, "r4"), 1)
        assert later["lengths"].ravel().tolist() == [5] and ["b", "c"] not in model.calls

    run(scenario())


def test_a_model_read_again_gets_a_whole_new_dispatch(http):
    """Cutting, merging and the window are sized together from the model as read: a model read
    again with more encoder instances gets all three anew, not a new merger beside an old window."""
    gateway = http.app.state.gateway
    model = gateway.registry.models["embed"]
    first = gateway.service.engine.dispatch(model)
    assert gateway.service.engine.dispatch(model) is first
    again = gateway.service.engine.dispatch(replace(model, encode_instances=model.encode_instances + 2))
    replicas = max(gateway.client.replica_count, 1)
    assert again is not first and again.calls == first.calls + 2 * replicas
    assert again.window is not None and again.window.capacity == again.calls * model.max_batch_size
    assert gateway.service.engine.dispatch(replace(model, fused=True)).window is None  # a fused model drops what it must


def test_online_calls_go_before_bulk_ones_and_keep_a_place_of_their_own():
    """Priority: bulk calls hold at most `bulk_calls` places, a freed place goes to the online calls
    waiting before any bulk one, and the two kinds are never merged."""
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=2, max_rows=8, bulk_calls=1)
        bulk = [asyncio.ensure_future(coalescer.call([f"b{i}"], None, f"b{i}", Priority.BULK)) for i in range(3)]
        await asyncio.sleep(0)
        assert model.calls == [["b0"]], "bulk work holds one place of two"
        online = asyncio.ensure_future(coalescer.call(["q"], None, "q", Priority.ONLINE))
        await asyncio.sleep(0)
        assert model.calls == [["b0"], ["q"]], "an online query finds the place kept for it"
        late = [asyncio.ensure_future(coalescer.call([t], None, t, Priority.ONLINE)) for t in ("q2", "q3")]
        await asyncio.sleep(0)
        model.gate.set()
        await asyncio.gather(*bulk, online, *late)
        # the online calls waiting left together, before the bulk ones waiting longer
        assert model.calls[2] == ["q2", "q3"] and model.calls[3] == ["b1", "b2"]
        assert coalescer.in_triton == 0

    run(scenario())


def test_without_priority_bulk_calls_take_every_place_in_order():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=2, max_rows=8)
        calls = [asyncio.ensure_future(coalescer.call([t], None, t, Priority.BULK)) for t in ("b0", "b1")]
        await asyncio.sleep(0)
        assert model.calls == [["b0"], ["b1"]]
        model.gate.set()
        await asyncio.gather(*calls)

    run(scenario())
