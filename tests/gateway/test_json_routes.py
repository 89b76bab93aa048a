"""The inference routes run by `JsonRoutes` answer exactly as FastAPI answers them: the same
status and body for bodies that do not parse, do not validate or do, on every such route; an
error nothing handles is a bare 500 that leaves the gateway serving."""

from __future__ import annotations

import httpx
import pytest

from prensa.gateway import json_routes
from prensa.gateway.app import INFERENCE_ROUTES
from prensa.gateway.service import Service
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.triton

BODIES = [
    b"", b"null", b"{", b"[1]", b'"text"', b"{}", b"\xff\xfe", b'{"inputs": "\\ud800"}', b"[" * 2000 + b"]" * 2000,
    b'{"inputs": 5}', b'{"inputs": "a", "truncate": "yes"}', b'{"inputs": "a", "normalize": []}',
    b'{"inputs": "a", "unknown": 1}', b'{"inputs": ["a", "b"], "truncate": true}',
    b'{"input": "a", "model": "minilm"}', b'{"input": [], "encoding_format": "base64"}',
    b'{"query": "q", "texts": "not a list"}', b'{"query": "q", "texts": ["a", "b"]}',
    b'{"query": "q", "documents": ["a"], "top_n": -1}', b'{"ids": [101, 2009, 102]}',
    b'{"inputs": {"source_sentence": "a", "sentences": ["a", "b"]}}', b'{"inputs": [["a", "b"]]}',
]
PATHS = sorted(route.path for route in INFERENCE_ROUTES if "POST" in route.methods)


def rounded(value: object) -> object:
    """JSON with floats to 4 places (embeddings may differ in the last bits between two runs) and
    without Cohere's `id`, fresh in every response."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items() if k != "id"}
    return value


def answers(url: str) -> dict[tuple[str, bytes, str], tuple[int, object]]:
    out = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for path in PATHS:
            for query in ("", "?model=nope"):
                for body in BODIES:
                    response = client.post(path + query, content=body,  # one id: error bodies carry it
                                           headers={"content-type": "application/json", "x-request-id": "same"})
                    out[path, body, query] = (response.status_code, rounded(response.json()))
    return out


def test_every_inference_route_is_served_by_json_routes():
    for route in INFERENCE_ROUTES:
        if route.methods == {"POST"}:
            assert json_routes.JsonEndpoint.of(route) is not None, route.path


def test_same_answers_as_fastapi(settings, monkeypatch):
    with running_gateway(settings) as url:
        ours = answers(url)
    with monkeypatch.context() as patch:
        patch.setattr(json_routes.JsonEndpoint, "of", classmethod(lambda cls, route: None))
        with running_gateway(settings) as url:
            fastapi = answers(url)
    assert {status for status, _ in ours.values()} >= {200, 400, 404, 422}
    assert ours == fastapi


def test_an_unexpected_error_is_a_500_and_the_next_request_is_served(settings, monkeypatch):
    async def fails(*args, **kwargs):
        raise RuntimeError("an internal detail")

    with running_gateway(settings) as url:
        with monkeypatch.context() as patch:
            patch.setattr(Service, "dense", fails)
            response = httpx.post(f"{url}/embed", json={"inputs": "ok"})
        assert (response.status_code, response.text) == (500, "Internal Server Error")
        assert httpx.post(f"{url}/embed", json={"inputs": "ok"}).status_code == 200
