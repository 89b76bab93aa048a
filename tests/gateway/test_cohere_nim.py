"""Cohere's embed and rerank shapes (v1, v2), Jina's rerank defaults and NIM's ranking and
truncation, against direct Triton calls, sentence-transformers' `quantize_embeddings` and the
model's own tokenizer (through transformers)."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from sentence_transformers.quantization import quantize_embeddings
from transformers import AutoTokenizer

pytestmark = pytest.mark.triton

TEXTS = ["Berlin is the capital and largest city of Germany.", "ok", "Rerankers score a query with each passage."]
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "A quick brown fox."]
FILLER = "The committee met on Tuesday to discuss the budget for the coming year. " * 60


def calibration_ranges(triton, model: str) -> np.ndarray:
    path = triton.options.repo / f"{model}_tokenize" / "1" / "calibration.json"
    return np.asarray(json.loads(path.read_text())["dense_ranges"], dtype=np.float32)


@pytest.mark.parametrize("model", ["minilm", "bge-m3", "minilm-fused"])
def test_embedding_types_follow_sentence_transformers(http, direct, triton, model):
    floats = direct(model, TEXTS)["dense"]
    ranges = calibration_ranges(triton, model.removesuffix("-fused"))
    assert ranges.shape == (2, floats.shape[1])
    body = http.post("/v2/embed", json={"model": model, "texts": TEXTS, "input_type": "search_document",
                                        "embedding_types": ["float", "int8", "uint8", "binary", "ubinary", "base64"]})
    assert body.status_code == 200, body.text
    answer = body.json()
    assert answer["response_type"] == "embeddings_by_type" and answer["texts"] == TEXTS
    embeddings = answer["embeddings"]
    np.testing.assert_allclose(embeddings["float"], floats, atol=1e-5)
    clipped = np.clip(floats, ranges[0], ranges[1])  # codes saturate outside the calibrated range
    for precision in ("int8", "uint8"):
        expected = quantize_embeddings(clipped, precision, ranges=ranges)
        assert np.abs(np.asarray(embeddings[precision]) - expected.astype(int)).max() <= 1, precision  # float noise
    for precision in ("binary", "ubinary"):
        np.testing.assert_array_equal(embeddings[precision], quantize_embeddings(floats, precision))
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in embeddings["base64"]]
    np.testing.assert_allclose(decoded, floats, atol=1e-5)


def test_int8_codes_do_not_depend_on_the_batch(http):
    alone = http.post("/v2/embed", json={"model": "minilm", "texts": TEXTS[:1], "embedding_types": ["int8"]}).json()
    together = http.post("/v2/embed", json={"model": "minilm", "texts": TEXTS, "embedding_types": ["int8"]}).json()
    assert alone["embeddings"]["int8"][0] == together["embeddings"]["int8"][0]


def test_v1_embed_shapes_and_refusals(http, direct):
    floats = http.post("/v1/embed", json={"model": "minilm", "texts": TEXTS}).json()
    assert floats["response_type"] == "embeddings_floats"
    np.testing.assert_allclose(floats["embeddings"], direct("minilm", TEXTS)["dense"], atol=1e-5)
    typed = http.post("/v1/embed", json={"model": "minilm", "texts": TEXTS, "embedding_types": ["ubinary"]}).json()
    assert typed["response_type"] == "embeddings_by_type" and set(typed["embeddings"]) == {"ubinary"}
    # a body Cohere cannot read is its 400 (the cohere SDK's BadRequestError), where TEI answers 422
    assert http.post("/v2/embed", json={"model": "minilm", "texts": TEXTS, "embedding_types": ["int4"]}).status_code == 400
    shortened = http.post("/v2/embed", json={"model": "minilm", "texts": TEXTS, "output_dimension": 64,
                                             "embedding_types": ["int8"]})
    assert shortened.status_code == 400 and "full dimension" in shortened.json()["message"]
    empty = http.post("/v2/embed", json={"model": "minilm", "texts": []})
    assert empty.status_code == 400


def test_cohere_truncate(http):
    long_text = FILLER + "Berlin."
    refused = http.post("/v2/embed", json={"model": "minilm", "texts": [long_text], "truncate": "NONE"})
    assert refused.status_code == 400 and "must have less than" in refused.json()["message"]
    start = http.post("/v2/embed", json={"model": "minilm", "texts": [long_text], "truncate": "START"}).json()
    left = http.post("/embed?model=minilm", json={"inputs": long_text, "truncation_direction": "left"}).json()
    np.testing.assert_allclose(start["embeddings"]["float"], left, atol=1e-6)
    end = http.post("/v2/embed", json={"model": "minilm", "texts": [long_text]}).json()
    right = http.post("/embed?model=minilm", json={"inputs": long_text}).json()
    np.testing.assert_allclose(end["embeddings"]["float"], right, atol=1e-6)


def test_max_tokens_cuts_each_text(http, direct, exports):
    tokenizer = AutoTokenizer.from_pretrained(exports["minilm"])
    answer = http.post("/v2/embed", json={"model": "minilm", "texts": TEXTS, "max_tokens": 6}).json()
    expected = direct("minilm", [token_prefix(tokenizer, t, 4) for t in TEXTS])["dense"]  # 6 with [CLS], [SEP]
    np.testing.assert_allclose(answer["embeddings"]["float"], expected, atol=1e-5)


def test_rerank_document_defaults(http):
    body = {"model": "reranker", "query": QUERY, "documents": PASSAGES}
    jina = http.post("/v1/rerank", json=body).json()
    assert all(r["document"] == {"text": PASSAGES[r["index"]]} for r in jina["results"])
    assert jina["usage"]["total_tokens"] > 0 and jina["model"] == "reranker"
    cohere_v1 = http.post("/v1/rerank", json=body, headers={"X-Fern-SDK-Name": "cohere"}).json()
    assert all("document" not in r for r in cohere_v1["results"])
    assert cohere_v1["meta"]["api_version"]["version"] == "1" and cohere_v1["id"]
    asked = http.post("/v1/rerank", json={**body, "return_documents": True}, headers={"X-Fern-SDK-Name": "cohere"})
    assert all("document" in r for r in asked.json()["results"])
    v2 = http.post("/v2/rerank", json={**body, "top_n": 2, "return_documents": False}).json()
    assert len(v2["results"]) == 2 and all("document" not in r for r in v2["results"])
    vllm = http.post("/v2/rerank", json=body).json()  # vLLM's clients send no `return_documents` and read them
    assert all(r["document"] == {"text": PASSAGES[r["index"]]} for r in vllm["results"])
    assert v2["meta"]["api_version"]["version"] == "2"
    scores = [r["relevance_score"] for r in v2["results"]]
    assert scores == sorted(scores, reverse=True)


def token_prefix(tokenizer, text: str, count: int) -> str:
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text[: offsets[min(count, len(offsets)) - 1][1]]


def test_max_tokens_per_doc_cuts_documents_first(http, direct, exports):
    tokenizer = AutoTokenizer.from_pretrained(exports["msmarco"])
    documents = [FILLER, "Berlin is the capital of Germany. " + FILLER]
    answer = http.post("/v2/rerank", json={"model": "msmarco", "query": QUERY, "documents": documents,
                                           "max_tokens_per_doc": 12}).json()
    cut = [token_prefix(tokenizer, d, 12) for d in documents]
    expected = direct("msmarco", [QUERY] * 2, cut)["scores"][:, 0]
    np.testing.assert_allclose(sorted([r["relevance_score"] for r in answer["results"]], reverse=True),
                               sorted(expected, reverse=True), atol=1e-5)


def test_max_chunks_per_doc_scores_the_best_window(http, direct, exports):
    """A long document whose answer lies past the window: truncated it scores low; in windows, its best
    window is the one with the answer."""
    tokenizer = AutoTokenizer.from_pretrained(exports["msmarco"])
    room = 512 - 3 - len(tokenizer(QUERY, add_special_tokens=False)["input_ids"])  # [CLS] query [SEP] .. [SEP]
    document = "word " * room + "Berlin is the capital and largest city of Germany."  # one token per "word"
    body = {"model": "msmarco", "query": QUERY, "documents": [document]}
    truncated = http.post("/v1/rerank", json=body).json()["results"][0]["relevance_score"]
    chunked = http.post("/v1/rerank", json={**body, "max_chunks_per_doc": 10}).json()["results"][0]["relevance_score"]
    offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    windows = [document[offsets[i][0]: offsets[min(i + room, len(offsets)) - 1][1]] for i in range(0, len(offsets), room)]
    assert len(windows) >= 2
    best = direct("msmarco", [QUERY] * len(windows), windows)["scores"][:, 0].max()
    np.testing.assert_allclose(chunked, best, atol=1e-5)
    assert chunked > truncated + 0.5


def test_nim_ranking(http, direct):
    body = {"model": "msmarco", "query": {"text": QUERY}, "passages": [{"text": p} for p in PASSAGES]}
    rankings = http.post("/v1/ranking", json=body).json()["rankings"]
    logits = direct("msmarco", [QUERY] * 3, PASSAGES)["logits"][:, 0]
    assert [r["index"] for r in rankings] == np.argsort(-logits, kind="stable").tolist()
    np.testing.assert_allclose([r["logit"] for r in rankings], np.sort(logits)[::-1], atol=1e-5)
    too_long = {**body, "passages": [{"text": FILLER}], "truncate": "NONE"}
    assert http.post("/v1/ranking", json=too_long).status_code == 422
    assert http.post("/v1/ranking", json={**too_long, "truncate": "END"}).status_code == 200


def test_nim_embedding_truncate(http):
    long_text = FILLER + "Berlin."
    refused = http.post("/v1/embeddings", json={"model": "minilm", "input": [long_text], "truncate": "NONE"})
    assert refused.status_code == 422 and refused.json()["type"] == "Validation"
    start = http.post("/v1/embeddings", json={"model": "minilm", "input": [long_text], "truncate": "START"}).json()
    left = http.post("/embed?model=minilm", json={"inputs": long_text, "truncation_direction": "left"}).json()
    np.testing.assert_allclose(start["data"][0]["embedding"], left[0], atol=1e-6)


def test_nim_and_jina_embedding_type_on_v1_embeddings(http, direct, triton):
    """Each type as sentence-transformers quantises it, never floats under another name."""
    floats = direct("minilm", TEXTS)["dense"]
    ranges = calibration_ranges(triton, "minilm")

    def embeddings(**fields):
        response = http.post("/v1/embeddings", json={"model": "minilm", "input": TEXTS, **fields})
        assert response.status_code == 200, response.text
        return [d["embedding"] for d in response.json()["data"]]

    clipped = np.clip(floats, ranges[0], ranges[1])
    for precision in ("int8", "uint8"):
        codes = np.asarray(embeddings(embedding_type=precision))
        assert np.abs(codes - quantize_embeddings(clipped, precision, ranges=ranges).astype(int)).max() <= 1
    for precision in ("binary", "ubinary"):
        np.testing.assert_array_equal(embeddings(embedding_type=precision), quantize_embeddings(floats, precision))
    np.testing.assert_allclose(embeddings(embedding_type="float"), floats, atol=1e-5)
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in embeddings(embedding_type="base64")]
    np.testing.assert_allclose(decoded, floats, atol=1e-5)
    mixed = http.post("/v1/embeddings", json={"model": "minilm", "input": "ok", "embedding_type": "int8",
                                              "encoding_format": "base64"})
    assert mixed.status_code == 422 and "embedding_type" in mixed.json()["message"]
    cut = http.post("/v1/embeddings", json={"model": "minilm", "input": "ok", "embedding_type": "int8", "dimensions": 8})
    assert cut.status_code == 422 and "full dimension" in cut.json()["message"]


def test_nim_role_suffixes_and_jina_tasks_pick_prompts(http, direct):
    from tests.tiny_models import PROMPTS

    query, passage = (direct("minilm-prompts", [PROMPTS[role] + TEXTS[0]])["dense"][0] for role in ("query", "passage"))

    def vector(**fields):
        response = http.post("/v1/embeddings", json={"input": TEXTS[0], **fields})
        assert response.status_code == 200, response.text
        return response.json()["data"][0]["embedding"]

    np.testing.assert_allclose(vector(model="minilm-prompts-query"), query, atol=1e-5)
    np.testing.assert_allclose(vector(model="minilm-prompts-passage"), passage, atol=1e-5)
    np.testing.assert_allclose(vector(model="minilm-prompts", task="retrieval.query"), query, atol=1e-5)
    np.testing.assert_allclose(vector(model="minilm-prompts", task="retrieval.passage"), passage, atol=1e-5)
    np.testing.assert_allclose(vector(model="minilm", task="retrieval.query"), direct("minilm", TEXTS[:1])["dense"][0],
                               atol=1e-5)  # a model without prompts embeds the text as given, as input_type does
    refusals = [({"model": "minilm-prompts-query", "input_type": "passage"}, "input_type"),
                ({"model": "minilm", "task": "text-matching"}, "text-matching"),
                ({"model": "minilm-prompts", "task": "retrieval.query", "input_type": "passage"}, "disagree"),
                ({"model": "minilm", "late_chunking": True, "truncate": "END"}, "late_chunking")]
    for fields, named in refusals:
        response = http.post("/v1/embeddings", json={"input": TEXTS[0], **fields})
        assert response.status_code == 422 and named in response.json()["message"], (fields, response.text)
    assert http.post("/v1/embeddings", json={"input": "ok", "model": "minilm", "late_chunking": False}).status_code == 200
    assert http.post("/v1/embeddings", json={"input": "ok", "model": "nope-query"}).status_code == 404


def test_nim_health_routes(http, start_gateway):
    assert http.get("/v1/health/ready").status_code == 200 and http.get("/v1/health/live").status_code == 200
    keyed = start_gateway(api_key="secret")
    for route in ("/v1/health/ready", "/v1/health/live"):  # open, as /health is
        assert httpx.get(f"{keyed}{route}").status_code == 200
