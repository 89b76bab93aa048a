"""Waiting calls leave in turn by client: one connection's flood delays another client's small call
by one of its calls, not by all of them, in the merging queue and in an ensemble's window alike.
The flood on a real gRPC port is in tests/gateway/test_tei_grpc.py."""

from __future__ import annotations

import asyncio

from prensa.gateway.core.coalesce import Coalescer
from prensa.gateway.core.limits import TritonWindow
from prensa.gateway.core.request_context import Priority
from prensa.gateway.core.turns import Turns
from tests.fast.test_coalesce import FakeModel
from tests.fast.test_priority import settle


def test_clients_take_turns_and_each_keeps_its_order():
    turns: Turns[str] = Turns()
    for call in ("f1", "f2", "f3"):
        turns.add("flood", call)
    turns.add("canary", "c1")
    turns.add("flood", "f4")
    turns.add("canary", "c2")
    assert turns.discard("flood", "f3") and not turns.discard("flood", "f3") and "f3" not in turns
    taken = [turns.take() for _ in range(len(turns))]
    assert taken == ["f1", "c1", "f2", "c2", "f4"] and not turns


def test_a_small_call_leaves_in_the_next_merged_call_beside_a_flood():
    async def scenario():
        model = FakeModel()
        coalescer = Coalescer(model.send, max_calls=1, max_rows=2)
        first = asyncio.ensure_future(coalescer.call(["f0"], None, "f0", client="flood"))
        await settle()
        flood = [asyncio.ensure_future(coalescer.call([f"f{i}"], None, f"f{i}", client="flood"))
                 for i in range(1, 7)]
        canary = asyncio.ensure_future(coalescer.call(["canary"], None, "c", client="canary"))
        await settle()
        model.gate.set()
        await asyncio.gather(first, *flood, canary)
        # first come, first served would send it fourth, after three calls of the flood's
        assert model.calls[:2] == [["f0"], ["f1", "canary"]], model.calls
        assert [text for call in model.calls for text in call if text != "canary"] == [f"f{i}" for i in range(7)]

    asyncio.run(scenario())


def test_the_window_lets_clients_in_by_turns():
    async def scenario():
        window, gate, started = TritonWindow(2), asyncio.Event(), []

        async def call(name):
            started.append(name)
            await gate.wait()
            return name

        def run(name, client, priority=Priority.ONLINE):
            return asyncio.ensure_future(window.run(2, lambda: call(name), priority, client))

        calls = [run(f"f{i}", "flood") for i in range(4)] + [run("canary", "canary")]
        await settle()
        assert started == ["f0"]
        gate.set()
        await asyncio.gather(*calls)
        assert started[:3] == ["f0", "f1", "canary"], started

    asyncio.run(scenario())
