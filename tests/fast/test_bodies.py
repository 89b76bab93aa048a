"""Every inference route, given bodies that do not parse, do not validate or do: the status and
the error shape its clients expect, never a 500, and the gateway serving on after each."""

from __future__ import annotations

import json

import pytest

from prensa.gateway.apis.dialects import error_shape
from prensa.gateway.app import INFERENCE_ROUTES
from prensa.gateway.errors import BAD_REQUEST_SHAPES
from tests.bodies import declared_error, error_kind

PATHS = sorted(route.path for route in INFERENCE_ROUTES if "POST" in route.methods)

# Bodies no route accepts, whatever its request model: the status each gets.
REFUSED = {
    b"": 422,  # no body: "Field required"
    b"{": 400, b"\xff\xfe": 400, b'{"inputs": "\\ud800"}': 400,  # not JSON (strict UTF-8, no lone surrogates)
    b"[" * 2000 + b"]" * 2000: 400,  # nested past orjson's limit, not a RecursionError
    b"null": 422, b"[1]": 422, b'"text"': 422,  # JSON, but not an object
}
# Bodies some routes accept and others refuse as the wrong shape.
SHAPES = [
    b"{}", b'{"inputs": 5}', b'{"inputs": "a", "truncate": "yes"}', b'{"inputs": "a", "normalize": []}',
    b'{"inputs": "a", "unknown": 1}', b'{"inputs": ["a", "b"], "truncate": true}', b'{"input": "a", "model": "embed"}',
    b'{"input": [], "encoding_format": "base64"}', b'{"query": "q", "texts": "not a list"}',
    b'{"query": "q", "texts": ["a", "b"]}', b'{"query": "q", "documents": ["a"], "top_n": -1}', b'{"ids": [101, 2009, 102]}',
    b'{"inputs": {"source_sentence": "a", "sentences": ["a", "b"]}}', b'{"inputs": [["a", "b"]]}',
]
JSON = {"content-type": "application/json"}


def assert_error_shape(path: str, response, status: int) -> None:
    """The status, and a body of the error model the route declares."""
    assert response.status_code == status, (path, response.status_code, response.text)
    assert error_kind(path, response.json()), (path, response.text)


@pytest.mark.parametrize("path", PATHS)
def test_bodies_no_route_accepts(http, path):
    """vLLM's own paths and Cohere's answer 400 where TEI's answer 422, as vLLM and Cohere do."""
    bad_request = (error_shape(path) or declared_error(path).shape) in BAD_REQUEST_SHAPES
    for body, status in REFUSED.items():
        assert_error_shape(path, http.post(path, content=body, headers=JSON), 400 if bad_request else status)


@pytest.mark.parametrize("path", PATHS)
def test_bodies_of_other_shapes(http, path):
    statuses = set()
    for body in SHAPES:
        response = http.post(path, content=body, headers=JSON)
        statuses.add(response.status_code)
        if response.status_code != 200:
            assert_error_shape(path, response, response.status_code)
            assert response.status_code in (400, 404, 422), (path, body, response.text)
    assert statuses - {200}, f"{path} accepted every body"  # each route refuses some of these shapes


def test_every_route_serves_a_body_of_its_own_shape(http):
    """A one-text request to each route answers 200: the refusals above are about the bodies."""
    bodies = own_bodies()
    for path in PATHS:
        body = bodies.get(path, {"inputs": "dog"})
        response = http.post(path, json=body)
        assert response.status_code == 200, (path, response.text)


def own_bodies() -> dict[str, dict]:
    return {"/embed_all": {"inputs": "dog", "model": "embed"}, "/embed_sparse": {"inputs": "dog", "model": "splade"},
            "/predict": {"inputs": "dog", "model": "classify"}, "/rerank": {"query": "q", "texts": ["dog"]},
            "/similarity": {"inputs": {"source_sentence": "dog", "sentences": ["fox"]}},
            "/tokenize": {"inputs": "dog"}, "/decode": {"ids": [5, 6]},
            "/v1/embeddings": {"input": "dog", "model": "embed"}, "/embeddings": {"input": "dog", "model": "embed"},
            "/v1/rerank": {"query": "q", "documents": ["dog"], "model": "rerank"},
            "/v2/rerank": {"query": "q", "documents": ["dog"], "model": "rerank"},
            "/v1/embed": {"texts": ["dog"], "model": "embed", "input_type": "search_query"},
            "/v2/embed": {"texts": ["dog"], "model": "embed", "input_type": "search_query", "embedding_types": ["float"]},
            "/v1/ranking": {"query": {"text": "q"}, "passages": [{"text": "dog"}], "model": "rerank"},
            "/vertex": {"instances": [{"inputs": "dog"}]}, "/embed_m3": {"inputs": "dog", "model": "m3"},
            "/v1/multi-vector": {"input": "dog", "model": "m3", "input_type": "document"},
            "/score": {"query": "dog", "passages": ["the lazy dog"], "model": "m3"},
            "/api/embed": {"input": "dog", "model": "embed"}, "/api/embeddings": {"prompt": "dog", "model": "embed"},
            "/classify": {"input": "dog", "model": "classify"}, "/pooling": {"input": "dog", "model": "embed"}}


VOLATILE_FIELDS = {"request_id", "id", "created", "total_duration", "load_duration", "prompt_eval_duration"}
VOLATILE_HEADERS = {"x-request-id", "date", "x-total-time", "x-compute-time", "x-tokenization-time", "x-queue-time",
                    "x-inference-time", "content-length"}


def settled(value):
    """A JSON answer without the fields that differ between two calls (ids, clocks)."""
    if isinstance(value, dict):
        return {k: settled(v) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [settled(v) for v in value]
    return value


def answer(response) -> tuple:
    try:
        body = settled(response.json())
    except ValueError:
        body = response.text
    headers = {k: v for k, v in response.headers.items() if k not in VOLATILE_HEADERS}
    return response.status_code, body, headers


@pytest.mark.parametrize("path", PATHS)
def test_direct_routes_answer_as_fastapi_does(http, through_fastapi, path, monkeypatch):
    """Every inference route runs without FastAPI's per-request machinery (`DirectRoutes`); its
    answers, errors and headers are those of the same route run by FastAPI, for every body above."""
    from prensa.gateway.http.routing import GatewayRoute

    direct_calls = []
    run_direct = GatewayRoute.run_direct

    async def counted(route, request):
        direct_calls.append(route.path)
        return await run_direct(route, request)

    monkeypatch.setattr(GatewayRoute, "run_direct", counted)
    own = json.dumps(own_bodies().get(path, {"inputs": "dog"})).encode()
    cases = [(query, body) for query in ("", "?model=nope") for body in (*REFUSED, *SHAPES, own)]
    cases += [(query, own) for query in ("?model=embed", "?model=embed&model=rerank", "?other=1")]
    for query, body in cases:
        direct = http.post(f"{path}{query}", content=body, headers=JSON)
        reference = through_fastapi.post(f"{path}{query}", content=body, headers=JSON)
        assert answer(direct) == answer(reference), (path, query, body)
    assert set(direct_calls) == {path}


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings"])
def test_an_unknown_model_is_404_in_the_routes_shape(http, path):
    body = {"inputs": "dog"} if path == "/embed" else {"input": "dog", "model": "nope"}
    assert_error_shape(path, http.post(f"{path}?model=nope", json=body), 404)


def undeclared(sent, kept, where: str = "") -> list[str]:
    """Fields of the answer `sent` that validating it against its model did not keep."""
    if isinstance(sent, dict) and isinstance(kept, dict):
        return [f"{where}.{key}" for key in sent if key not in kept] + \
            [found for key in sent if key in kept for found in undeclared(sent[key], kept[key], f"{where}.{key}")]
    if isinstance(sent, list) and isinstance(kept, list):
        return [found for index, (a, b) in enumerate(zip(sent, kept)) for found in undeclared(a, b, f"{where}[{index}]")]
    return []


@pytest.mark.parametrize("path", PATHS)
def test_every_answer_is_what_its_route_declares(http, path):
    """The OpenAPI schema clients generate code from is the payload: each route's 200 answer
    validates against its declared `response_model`, and sends no field the model lacks."""
    from pydantic import TypeAdapter

    route = next(r for r in INFERENCE_ROUTES if r.path == path and "POST" in r.methods)
    if route.response_model is None:
        pytest.skip(f"{path} declares no response model")
    answer = http.post(path, json=own_bodies().get(path, {"inputs": "dog"}))
    assert answer.status_code == 200, answer.text
    declared = TypeAdapter(route.response_model)
    kept = declared.dump_python(declared.validate_python(answer.json()), mode="json", by_alias=True)
    assert not undeclared(answer.json(), kept), undeclared(answer.json(), kept)
