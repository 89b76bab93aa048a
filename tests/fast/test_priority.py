"""Online requests before bulk work wherever they wait in the gateway: its permits and the rows an
ensemble has in Triton (`TritonWindow`); the merging queue's order is in test_coalesce."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from prensa.gateway.core.dispatch import ModelDispatch
from prensa.gateway.core.limits import Permits, TritonWindow
from prensa.gateway.core.request_context import PRIORITY_HEADER, Priority
from prensa.gateway.errors import ErrorKind, GatewayError


def test_bulk_work_leaves_online_requests_a_share_of_the_permits():
    permits = Permits(8, lambda _: None, bulk_share=0.75)
    with permits.hold(6, Priority.BULK):
        with pytest.raises(GatewayError) as refused, permits.hold(1, Priority.BULK):
            pass
        assert refused.value.kind is ErrorKind.OVERLOADED
        with permits.hold(2, Priority.ONLINE):  # the share kept for online requests
            assert permits.in_use == 8
    assert permits.in_use == 0
    # larger than its share: it goes alone, when nothing is held
    with permits.hold(8, Priority.BULK), pytest.raises(GatewayError), permits.hold(1, Priority.ONLINE):
        pass


async def settle():
    """Let every task ready to run take its steps."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_window_lets_online_calls_in_first_and_keeps_them_room():
    async def scenario():
        window, gate, started = TritonWindow(4, bulk_capacity=2), asyncio.Event(), []

        async def call(name):
            started.append(name)
            await gate.wait()
            return name

        def run(name, rows, priority):
            return asyncio.ensure_future(window.run(rows, lambda: call(name), priority))

        bulk = [run("b0", 2, Priority.BULK), run("b1", 2, Priority.BULK)]
        await settle()
        assert started == ["b0"] and window.in_triton == 2, "bulk holds at most its 2 rows"
        online = [run("q0", 2, Priority.ONLINE), run("q1", 1, Priority.ONLINE)]
        await settle()
        assert started == ["b0", "q0"], "the online call takes the room kept for it"
        gate.set()
        assert await asyncio.gather(*bulk, *online) == ["b0", "b1", "q0", "q1"]
        # freed rows went to the waiting online call before the bulk one that waited longer
        assert started.index("q1") < started.index("b1") and window.in_triton == 0

    asyncio.run(scenario())


@pytest.fixture
def recorded(monkeypatch):
    """The rows and priority of every text call the gateway sends to its backend."""
    calls: list[tuple[int, Priority]] = []
    original = ModelDispatch.send

    async def send(self, texts, pairs, outputs, request_id, priority=Priority.ONLINE, client=""):
        calls.append((len(texts), priority))
        return await original(self, texts, pairs, outputs, request_id, priority, client)

    monkeypatch.setattr(ModelDispatch, "send", send)
    return calls


TEXTS = [f"passage number {i} about rivers" for i in range(6)]


def test_bulk_requests_are_answered_as_online_ones_in_paced_calls(start_gateway, recorded):
    gateway = start_gateway(bulk_call_time_s=1e-6)  # shorter than any row: one row a call
    quiet = gateway.post("/embed", json={"inputs": TEXTS}, headers={PRIORITY_HEADER: "bulk"})
    # no online request yet: bulk work goes in full batches
    assert quiet.status_code == 200 and recorded == [(6, Priority.BULK)]
    recorded.clear()
    online = gateway.post("/embed", json={"inputs": TEXTS})
    assert online.status_code == 200 and recorded == [(6, Priority.ONLINE)]
    recorded.clear()
    bulk = gateway.post("/embed", json={"inputs": TEXTS}, headers={PRIORITY_HEADER: "bulk"})
    assert bulk.status_code == 200
    assert np.allclose(bulk.json(), online.json(), atol=1e-6)
    assert np.allclose(quiet.json(), online.json(), atol=1e-6)
    # online requests come: bulk calls are paced
    assert recorded == [(1, Priority.BULK)] * 6


def test_vllm_priority_above_zero_is_bulk_and_a_wrong_header_is_refused(start_gateway, recorded):
    gateway = start_gateway()
    body = {"input": TEXTS[:2], "truncate_prompt_tokens": -1, "priority": 1}
    assert gateway.post("/v1/embeddings", json=body).status_code == 200
    assert {p for _, p in recorded} == {Priority.BULK}
    refused = gateway.post("/embed", json={"inputs": "x"}, headers={PRIORITY_HEADER: "urgent"})
    assert refused.status_code == 422 and PRIORITY_HEADER in refused.json()["error"]


def test_without_priority_bulk_requests_wait_as_online_ones(start_gateway, recorded):
    gateway = start_gateway(priority=False)
    answer = gateway.post("/embed", json={"inputs": TEXTS}, headers={PRIORITY_HEADER: "bulk"})
    assert answer.status_code == 200 and recorded == [(6, Priority.ONLINE)]
