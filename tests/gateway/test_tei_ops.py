"""/tokenize and /decode against `tokenizers`; /info, /health (Triton up, never there, gone), /metrics, docs."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from prensa.addresses import free_port
from tests.gateway.conftest import TcpForwarder

pytestmark = pytest.mark.triton

TEXT = "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。"


@pytest.mark.parametrize("model", ["minilm", "bge-m3"])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_matches_tokenizers(http, tokenizer, model, add_special_tokens):
    body = http.post(f"/tokenize?model={model}", json={"inputs": [TEXT, "ok"], "add_special_tokens": add_special_tokens})
    assert body.status_code == 200
    for text, tokens in zip([TEXT, "ok"], body.json()):
        encoding = tokenizer(model).encode(text, add_special_tokens=add_special_tokens)
        assert [t["id"] for t in tokens] == encoding.ids
        assert [t["special"] for t in tokens] == [bool(m) for m in encoding.special_tokens_mask]
        data = text.encode()
        for token, piece in zip(tokens, encoding.tokens):
            if token["special"]:
                assert token["text"] == piece and token["start"] is None and token["stop"] is None
            else:  # TEI reports UTF-8 byte offsets; the text is that slice of the input
                assert token["text"] == data[token["start"]: token["stop"]].decode()
    single = http.post(f"/tokenize?model={model}", json={"inputs": "ok"}).json()
    assert len(single) == 1  # always nested


def test_decode_matches_tokenizers(http, tokenizer):
    tok = tokenizer("bge-m3")
    ids = [tok.encode(TEXT).ids, tok.encode("ok").ids]
    assert http.post("/decode?model=bge-m3", json={"ids": ids}).json() == tok.decode_batch(ids)
    assert http.post("/decode?model=bge-m3", json={"ids": ids[0], "skip_special_tokens": False}).json() == [
        tok.decode(ids[0], skip_special_tokens=False)]


def test_info_default_and_by_name(http, triton):
    default = http.get("/info").json()
    assert default["served_model_name"] == "minilm"
    assert default["model_type"] == {"embedding": {"pooling": "mean"}}
    assert default["max_input_length"] == 256 and default["max_client_batch_size"] == 32
    assert default["max_concurrent_requests"] == 512 and default["auto_truncate"] is True
    assert {m["served_model_name"] for m in default["models"]} >= {"minilm", "bge-m3"}
    m3 = http.get("/info?model=bge-m3").json()
    assert m3["task"] == "m3" and m3["model_type"] == {"embedding": {"pooling": "cls"}}
    assert http.get("/info?model=nope").status_code == 404


def test_health_up_never_there_and_gone(http, triton, start_gateway):
    assert http.get("/health").status_code == 200
    assert http.get("/ping").status_code == 200
    nowhere = start_gateway(triton_url=f"127.0.0.1:{free_port()}")
    unhealthy = httpx.get(f"{nowhere}/health")
    assert unhealthy.status_code == 503
    assert unhealthy.json()["error_type"] == "Unhealthy" and unhealthy.json()["error"].startswith("unhealthy")
    refused = httpx.post(f"{nowhere}/embed", json={"inputs": "ok"})
    assert refused.status_code == 503 and refused.json()["error_type"] == "Unhealthy"
    relay = TcpForwarder(triton.grpc_url)
    via_relay = start_gateway(triton_url=relay.url)
    assert httpx.get(f"{via_relay}/health").status_code == 200
    assert httpx.post(f"{via_relay}/embed", json={"inputs": "ok"}).status_code == 200
    relay.cut()
    assert httpx.get(f"{via_relay}/health").status_code == 503
    started = time.perf_counter()
    gone = httpx.post(f"{via_relay}/embed", json={"inputs": "ok"})
    assert gone.status_code == 503 and gone.json()["error_type"] == "Unhealthy"
    assert time.perf_counter() - started < 2.5, "a vanished Triton must fail fast, not after the call timeout"


def test_metrics_use_tei_names(http):
    http.post("/embed", json={"inputs": "ok"})
    http.post("/embed", json={"inputs": ""})
    text = http.get("/metrics").text
    assert re.search(r'^te_request_count\{method="embed"\} [1-9]', text, re.M)
    assert re.search(r'^te_request_success\{method="embed"\} [1-9]', text, re.M)
    assert re.search(r'^te_embed_count\{method="embed"\} [1-9]', text, re.M)
    assert re.search(r'^te_request_failure\{err="validation"\} [1-9]', text, re.M)
    for name in ("te_request_duration_count", "te_request_inference_duration_count", "te_request_input_length_count",
                 "te_embed_duration_count", "te_embed_inference_duration_count", "prensa_triton_call_size_count",
                 "prensa_inputs_in_flight"):
        assert re.search(rf"^{name} ", text, re.M), name


def test_docs_and_openapi(http):
    assert http.get("/docs").status_code == 200
    spec = http.get("/openapi.json").json()
    for path in ("/v1/embeddings", "/embed", "/embed_sparse", "/embed_all", "/embed_colbert", "/rerank", "/v1/rerank",
                 "/v2/rerank", "/v1/embed", "/v2/embed", "/v1/ranking", "/v1/models", "/", "/vertex", "/predict",
                 "/similarity", "/tokenize", "/decode", "/info", "/health"):
        assert path in spec["paths"], path
    fields = spec["components"]["schemas"]["EmbedRequest"]["properties"]
    assert all(field.get("description") for field in fields.values())


def test_without_tokenizers_and_backend_errors(start_gateway, tmp_path, direct):
    """A gateway whose --repo holds no tokenizer still embeds texts; what needs one says so (422
    Tokenizer); a Triton failure (an out-of-vocabulary id reaching the encoder) is 424 Backend."""
    url = start_gateway(repo=tmp_path)
    plain = httpx.post(f"{url}/embed", json={"inputs": "ok"})
    assert plain.status_code == 200
    assert plain.json()[0] == pytest.approx(direct("minilm", ["ok"])["dense"][0].tolist(), abs=1e-6)
    for path, body in (("/tokenize", {"inputs": "ok"}), ("/embed", {"inputs": "ok", "truncate": False})):
        response = httpx.post(f"{url}{path}", json=body)
        assert response.status_code == 422 and response.json()["error_type"] == "Tokenizer", path
    backend = httpx.post(f"{url}/embed", json={"inputs": [[101, 10**7, 102]]})
    assert backend.status_code == 424 and backend.json()["error_type"] == "Backend"
    assert backend.json()["error"].startswith("Backend error: ")
    assert httpx.post(f"{url}/embed", json={"inputs": "ok"}).status_code == 200  # Triton carries on
