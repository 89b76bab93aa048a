"""Admission rules: client batch size (refused or split), body size, API key, CORS, and a burst over
--max-concurrent-requests (immediate 429s; admitted requests as fast as unloaded ones, right vectors);
idle connections outlive the clients' own keep-alive; a serving gateway keeps its startup heap out
of the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import http.client
import time

import httpx
import numpy as np
import openai
import pytest

from tests.bodies import error_of
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton

BATCH = [f"sentence number {i} about the city of Berlin" for i in range(33)]


def test_batch_over_the_limit_is_422(http):
    response = http.post("/embed", json={"inputs": BATCH})
    assert response.status_code == 422
    assert error_of(response) == {"error": "batch size 33 > maximum allowed batch size 32", "error_type": "Validation"}
    assert http.post("/embed", json={"inputs": BATCH[:32]}).status_code == 200


def test_split_large_batches(start_gateway, direct):
    url = start_gateway(split_large_batches=True, max_client_batch_size=8)
    response = httpx.post(f"{url}/embed", json={"inputs": BATCH}, timeout=60)
    assert response.status_code == 200
    expected = np.concatenate([direct("minilm", BATCH[:20])["dense"], direct("minilm", BATCH[20:])["dense"]])
    np.testing.assert_allclose(response.json(), expected, atol=1e-6)
    sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": [*BATCH[:10], "x " * 50]}, timeout=60).json()
    reference = direct("bge-m3", [*BATCH[:10], "x " * 50])
    for row, terms in enumerate(sparse):  # chunks padded to different widths are merged row by row
        ids = reference["sparse_ids"][row]
        assert [t["index"] for t in terms] == ids[ids >= 0].tolist()


def test_an_idle_connection_outlives_the_clients_keep_alive(gateway):
    """httpx and the OpenAI SDK reuse a connection for 5 s. A server closing idle ones as early races
    with them: a request sent as it closes gets no response at all."""
    connection = http.client.HTTPConnection(gateway.removeprefix("http://"), timeout=30)
    try:
        connection.request("POST", "/embed", '{"inputs": "first"}', {"content-type": "application/json"})
        assert connection.getresponse().read() and connection.sock is not None
        first_socket = connection.sock
        time.sleep(5.5)
        connection.request("POST", "/embed", '{"inputs": "after a pause"}', {"content-type": "application/json"})
        assert connection.getresponse().status == 200 and connection.sock is first_socket
    finally:
        connection.close()


def test_payload_limit_before_parsing(start_gateway):
    url = start_gateway(payload_limit=1000)
    too_big = httpx.post(f"{url}/embed", json={"inputs": "x" * 2000})
    assert too_big.status_code == 413 and too_big.json()["error_type"] == "PayloadTooLarge"
    openai_shape = httpx.post(f"{url}/v1/embeddings", json={"input": "x" * 2000})
    assert openai_shape.status_code == 413 and openai_shape.json()["code"] == 413

    def chunked():  # no Content-Length: counted while reading
        yield b'{"inputs": "'
        yield b"y" * 2000
        yield b'"}'

    streamed = httpx.post(f"{url}/embed", content=chunked(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert httpx.post(f"{url}/embed", json={"inputs": "x" * 500}).status_code == 200


def test_api_key(start_gateway, direct):
    url = start_gateway(api_key="s3cret")
    for path, body in (("/embed", {"inputs": "ok"}), ("/v1/embeddings", {"input": "ok"}), ("/tokenize", {"inputs": "ok"}),
                       ("/decode", {"ids": [101]}), ("/rerank", {"query": "q", "texts": ["t"]})):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = httpx.post(f"{url}{path}", json=body, headers=headers)
            assert response.status_code == 401 and response.content == b"", (path, headers)
    assert httpx.get(f"{url}/info").status_code == 401
    for path in ("/health", "/metrics", "/docs", "/openapi.json"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    ok = httpx.post(f"{url}/embed", json={"inputs": "ok"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
    vector = client.embeddings.create(model="minilm", input="ok", encoding_format="float").data[0].embedding
    np.testing.assert_allclose(vector, direct("minilm", ["ok"])["dense"][0], atol=1e-6)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).embeddings.create(model="minilm", input="ok")


def test_cors(start_gateway):
    url = start_gateway(cors_allow_origins=("https://app.example",), api_key="k")  # preflights need no key
    preflight = httpx.options(f"{url}/embed", headers={"Origin": "https://app.example",
                                                       "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(f"{url}/embed", headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_burst_over_max_concurrent_requests(start_gateway, direct):
    url = start_gateway(max_concurrent_requests=4)
    texts = [f"{'a long sentence about Berlin and its museums ' * 20} number {i}" for i in range(16)]
    expected = direct("minilm", texts)["dense"]

    async def burst(batch: list[str]) -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=16)) as client:
            await asyncio.gather(*(client.get("/health") for _ in range(16)))  # open 16 connections first

            async def one(text: str) -> tuple[httpx.Response, float]:
                started = time.perf_counter()
                response = await client.post("/embed", json={"inputs": text})
                return response, time.perf_counter() - started

            return await asyncio.gather(*(one(t) for t in batch))

    quiet = asyncio.run(burst(texts[:4]))  # as many as there are permits: the latency to hold to
    assert [r.status_code for r, _ in quiet] == [200] * 4
    results = asyncio.run(burst(texts))
    admitted = [i for i, (r, _) in enumerate(results) if r.status_code == 200]
    refused = [i for i, (r, _) in enumerate(results) if r.status_code == 429]
    assert len(admitted) + len(refused) == 16
    assert len(admitted) >= 4 and refused, f"{len(refused)} of 16 refused with 4 permits"
    for i in refused:
        assert error_of(results[i][0]) == {"error": "Model is overloaded", "error_type": "Overloaded"}
    slowest_admitted = max(results[i][1] for i in admitted)
    assert all(results[i][1] < slowest_admitted for i in refused), "429 must come at once, without queueing"
    quiet_s = max(seconds for _, seconds in quiet)
    assert slowest_admitted < 3 * quiet_s + 1.0, f"admitted {slowest_admitted:.2f} s vs {quiet_s:.2f} s unloaded"
    for i in admitted:
        np.testing.assert_allclose(results[i][0].json()[0], expected[i], atol=1e-5)


def test_a_serving_gateway_freezes_its_startup_heap_and_thaws_it_on_shutdown(settings):
    gc.unfreeze()  # another gateway of this session may have frozen it: start from nothing frozen
    with running_gateway(settings) as url:
        deadline = time.monotonic() + 10
        while gc.get_freeze_count() == 0:  # frozen just after uvicorn reports it started
            assert time.monotonic() < deadline, "the gateway's startup heap was not frozen"
            time.sleep(0.02)
        assert httpx.post(f"{url}/embed", json={"inputs": "a query"}).status_code == 200
    assert gc.get_freeze_count() == 0  # collectable again once it stopped
