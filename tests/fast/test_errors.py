"""Error shapes and statuses of the gateway over the in-process backend, as over Triton: the
admission middleware's (401, 413, 415), validation (400, 422), the registry's (404), admission (429) and a
stage's own failure (424); request ids are echoed in headers and bodies."""

from __future__ import annotations

import pytest

from prensa.gateway.core.service import Service

POISON = 10**6  # past the vocabulary: the encoder's Gather fails


def error_of(response, status: int, error_type: str, openai: bool = False) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    if openai:
        assert body["type"] == error_type and body["code"] == status
        return body["message"]
    assert body["error_type"] == error_type
    return body["error"]


def test_validation_errors(http):
    assert "cannot be empty" in error_of(http.post("/embed", json={"inputs": []}), 400, "Empty")
    assert "cannot be empty" in error_of(http.post("/embed", json={"inputs": [""]}), 422, "Validation")
    assert "inputs" in error_of(http.post("/embed", json={"text": "x"}), 422, "Validation")
    malformed = http.post("/embed", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert "JSON" in error_of(malformed, 400, "Validation")
    assert "batch size 33 > maximum allowed batch size 32" in error_of(
        http.post("/embed", json={"inputs": ["dog"] * 33}), 422, "Validation")
    assert "does not provide reranking" in error_of(
        http.post("/rerank", json={"model": "embed", "query": "q", "texts": ["t"]}), 422, "Validation")
    openai = http.post("/v1/embeddings", json={"input": []})
    assert error_of(openai, 400, "Empty", openai=True)


def test_unknown_model_is_404_in_each_shape(http):
    assert "`nope` does not exist" in error_of(http.post("/embed", json={"inputs": "x", "model": "nope"}), 404,
                                               "NotFound")
    assert "`nope`" in error_of(http.post("/v1/embeddings", json={"input": "x", "model": "nope"}), 404, "NotFound",
                                openai=True)
    assert http.get("/v1/models/nope").status_code == 404


def test_content_type_and_payload_limit(http, start_gateway):
    assert "Content-Type" in error_of(http.post("/embed", content=b"dog", headers={"content-type": "text/plain"}),
                                      415, "UnsupportedMediaType")
    small = start_gateway(payload_limit=100)
    assert "Payload too large" in error_of(small.post("/embed", json={"inputs": "dog " * 100}), 413, "PayloadTooLarge")
    assert small.post("/embed", json={"inputs": "dog"}).status_code == 200


def test_api_key(start_gateway):
    guarded = start_gateway(api_key="sesame")
    assert guarded.post("/embed", json={"inputs": "dog"}).status_code == 401
    assert guarded.post("/embed", json={"inputs": "dog"}, headers={"authorization": "Bearer nope"}).status_code == 401
    assert guarded.post("/embed", json={"inputs": "dog"}, headers={"authorization": "Bearer sesame"}).status_code == 200
    assert guarded.get("/health").status_code == 200  # open, as in TEI


def test_exhausted_permits_are_429(start_gateway):
    tight = start_gateway(max_concurrent_requests=1)
    assert "overloaded" in error_of(tight.post("/embed", json={"inputs": ["dog", "fox"]}), 429, "Overloaded")
    assert tight.post("/embed", json={"inputs": ["dog"]}).status_code == 200


def test_request_ids_are_echoed(http):
    ok = http.post("/embed", json={"inputs": "dog"}, headers={"x-request-id": "fast-ok-1"})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "fast-ok-1"
    failed = http.post("/embed", json={"inputs": []}, headers={"x-request-id": "fast-err-2"})
    assert failed.headers["x-request-id"] == "fast-err-2" and failed.json()["request_id"] == "fast-err-2"
    assert http.post("/embed", json={"inputs": "dog"}).headers["x-request-id"]  # one made up when none is given


def test_a_stage_error_is_424_without_paths(served, start_gateway, tmp_path):
    """Without tokenizer files (the gateway's --repo is elsewhere) the gateway cannot check ids,
    so the out-of-vocabulary id reaches the encode stage, whose error comes back as Triton's would."""
    blind = start_gateway(repo=tmp_path, backend_repo=served.repo)
    poisoned = blind.post("/embed", json={"inputs": [[2, POISON, 3]]})
    message = error_of(poisoned, 424, "Backend")
    assert "encoder failed" in message and str(served.repo) not in poisoned.text
    assert blind.post("/embed", json={"inputs": [[2, 20, 3]]}).status_code == 200
    refused = blind.post("/embed", json={"inputs": "dog", "truncation_direction": "left"})
    assert error_of(refused, 422, "Tokenizer")


@pytest.mark.parametrize("path", ["/health", "/ping", "/"])
def test_health_routes(http, path):
    assert http.get(path).status_code == 200


def test_an_unexpected_error_is_a_bare_500_and_the_next_request_is_served(http, monkeypatch):
    async def fails(*args, **kwargs):
        raise RuntimeError("an internal detail")

    with monkeypatch.context() as patch:
        patch.setattr(Service, "run", fails)
        response = http.post("/embed", json={"inputs": "dog"}, headers={"x-request-id": "fast-500"})
    assert (response.status_code, response.text) == (500, "Internal Server Error")
    assert response.headers["x-request-id"] == "fast-500"
    assert http.post("/embed", json={"inputs": "dog"}).status_code == 200


def test_a_model_slower_than_the_timeout_is_503_and_the_gateway_serves_on(start_gateway, monkeypatch):
    import time

    from prensa.triton.inprocess import ModelRepository

    original = ModelRepository.infer

    def slow(self, model, inputs, outputs):
        time.sleep(0.5)
        return original(self, model, inputs, outputs)

    impatient = start_gateway(triton_timeout_s=0.1)
    with monkeypatch.context() as patch:
        patch.setattr(ModelRepository, "infer", slow)
        assert "did not answer within 0.1 s" in error_of(impatient.post("/embed", json={"inputs": "dog"}), 503,
                                                          "Unhealthy")
    assert impatient.post("/embed", json={"inputs": "dog"}).status_code == 200
