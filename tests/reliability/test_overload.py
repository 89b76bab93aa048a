"""Overload past the gateway's permits is tests/gateway/test_limits.py's burst test (immediate 429s,
right vectors, bounded latency). Here the gateway admits everything and Triton's own bounded
queue (`max_queue_size`) is what overflows: the rejection must come back as 429 Overloaded at
once, admitted requests must get the vectors a quiet run gives, and nothing may hang."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import numpy as np
import pytest

from prensa.gateway.settings import GatewaySettings
from prensa.triton.repo import ServingOptions
from tests.bodies import error_of
from tests.gateway.conftest import running_gateway
from tests.reliability.conftest import build_repo, own_triton

pytestmark = pytest.mark.triton
TEXTS = [f"sentence {i} about the river, the bridges and the old town " * 12 for i in range(32)]
DEADLINE_S = 30.0  # the whole burst; one request alone takes ~0.1 s


def test_full_triton_queue_is_429_and_nothing_hangs(tmp_path, exports):
    repo = build_repo(exports, ["minilm"], tmp_path / "repo", ServingOptions(max_queue_size=1))
    with own_triton(repo, tmp_path / "tritonserver.log") as triton, \
            running_gateway(GatewaySettings(triton_url=triton.grpc_url, repo=repo, coalesce_requests=False)) as url:
        # Not merging: merged calls keep Triton's queue short themselves, so the queue of 1 would never fill.
        quiet = np.asarray(httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60).json())
        started = time.perf_counter()
        quiet_one = httpx.post(f"{url}/embed", json={"inputs": TEXTS[0]}, timeout=60)
        single_s = time.perf_counter() - started
        assert quiet_one.status_code == 200

        async def burst() -> list[tuple[httpx.Response, float]]:
            limits = httpx.Limits(max_connections=len(TEXTS))
            async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S, limits=limits) as client:
                await asyncio.gather(*(client.get("/health") for _ in TEXTS))  # connections open first

                async def one(text: str) -> tuple[httpx.Response, float]:
                    sent = time.perf_counter()
                    response = await client.post("/embed", json={"inputs": text})
                    return response, time.perf_counter() - sent

                return await asyncio.wait_for(asyncio.gather(*(one(t) for t in TEXTS)), DEADLINE_S)

        results = asyncio.run(burst())
        statuses = Counter(r.status_code for r, _ in results)
        assert set(statuses) == {200, 429}, f"a queue of 1 must both admit and refuse: {statuses}"
        for i, (response, _) in enumerate(results):
            if response.status_code == 429:
                assert error_of(response) == {"error": "Model is overloaded", "error_type": "Overloaded"}
            else:
                np.testing.assert_allclose(response.json()[0], quiet[i], atol=1e-5)
        slowest = max(seconds for _, seconds in results)
        assert slowest < 20 * single_s + 2.0, f"slowest answer {slowest:.2f} s; one request alone {single_s:.2f} s"
        assert httpx.get(f"{url}/health").status_code == 200
        after = httpx.post(f"{url}/embed", json={"inputs": TEXTS[1]}, timeout=30)
        np.testing.assert_allclose(after.json()[0], quiet[1], atol=1e-5)
