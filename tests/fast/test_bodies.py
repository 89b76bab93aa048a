"""Every inference route, given bodies that do not parse, do not validate or do: the status and
the error shape its clients expect, never a 500, and the gateway serving on after each."""

from __future__ import annotations

import pytest

from prensa.gateway.app import INFERENCE_ROUTES
from prensa.gateway.errors import is_openai_path

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
    assert response.status_code == status, (path, response.status_code, response.text)
    body = response.json()
    if is_openai_path(path):
        assert body["code"] == status and body["message"] and body["type"], (path, body)
    else:
        assert body["error"] and body["error_type"], (path, body)


@pytest.mark.parametrize("path", PATHS)
def test_bodies_no_route_accepts(http, path):
    for body, status in REFUSED.items():
        assert_error_shape(path, http.post(path, content=body, headers=JSON), status)


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
    bodies = {"/embed_all": {"inputs": "dog", "model": "embed"}, "/embed_sparse": {"inputs": "dog", "model": "splade"},
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
              "/score": {"query": "dog", "passages": ["the lazy dog"], "model": "m3"},
              "/api/embed": {"input": "dog", "model": "embed"}, "/api/embeddings": {"prompt": "dog", "model": "embed"}}
    for path in PATHS:
        body = bodies.get(path, {"inputs": "dog"})
        response = http.post(path, json=body)
        assert response.status_code == 200, (path, response.text)


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings"])
def test_an_unknown_model_is_404_in_the_routes_shape(http, path):
    body = {"inputs": "dog"} if path == "/embed" else {"input": "dog", "model": "nope"}
    assert_error_shape(path, http.post(f"{path}?model=nope", json=body), 404)
