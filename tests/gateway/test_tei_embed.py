"""TEI's embedding routes, field by field, against direct Triton calls, `tokenizers` and numpy."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.bodies import error_of

pytestmark = pytest.mark.triton

LONG = "Berlin is the capital and largest city of Germany. " * 40  # ~400 minilm tokens, over its 256


def test_embed_single_and_batch(http, direct):
    texts = ["What is the capital of Germany?", "ok"]
    single = http.post("/embed", json={"inputs": texts[0]})
    batch = http.post("/embed", json={"inputs": texts})
    expected = direct("minilm", texts)["dense"]
    assert single.status_code == batch.status_code == 200
    assert np.array(single.json()).shape == (1, 384)  # always nested
    np.testing.assert_allclose(single.json()[0], expected[0], atol=1e-6)
    np.testing.assert_allclose(batch.json(), expected, atol=1e-6)


def test_timing_and_count_headers(http, direct):
    texts = ["What is the capital of Germany?", "ok"]
    response = http.post("/embed", json={"inputs": texts})
    assert int(response.headers["x-compute-tokens"]) == int(direct("minilm", texts)["num_tokens"].sum())
    assert int(response.headers["x-compute-characters"]) == sum(map(len, texts))
    for name in ("x-compute-time", "x-total-time", "x-queue-time", "x-inference-time", "x-tokenization-time"):
        assert int(response.headers[name]) >= 0
    assert int(response.headers["x-total-time"]) >= int(response.headers["x-inference-time"])


def test_whitespace_only_is_embedded_empty_is_refused(http, direct):
    spaces = http.post("/embed", json={"inputs": "   "})
    np.testing.assert_allclose(spaces.json()[0], direct("minilm", ["   "])["dense"][0], atol=1e-6)
    empty_string = http.post("/embed", json={"inputs": ""})
    assert empty_string.status_code == 422
    assert error_of(empty_string) == {"error": "Input validation error: `inputs` cannot be empty", "error_type": "Validation"}
    empty_batch = http.post("/embed", json={"inputs": []})
    assert empty_batch.status_code == 400
    assert error_of(empty_batch) == {"error": "`inputs` cannot be empty", "error_type": "Empty"}


def test_too_long_with_and_without_truncation(http, direct, tokenizer, start_gateway):
    given = len(tokenizer("minilm").encode(LONG).ids)
    assert given > 256
    truncated = http.post("/embed", json={"inputs": LONG})  # truncate: null -> --auto-truncate (on)
    np.testing.assert_allclose(truncated.json()[0], direct("minilm", [LONG])["dense"][0], atol=1e-6)
    explicit = http.post("/embed", json={"inputs": LONG, "truncate": True})
    np.testing.assert_allclose(explicit.json(), truncated.json(), atol=1e-6)
    refused = http.post("/embed", json={"inputs": ["ok", LONG], "truncate": False})
    assert refused.status_code == 422
    assert error_of(refused) == {"error": f"Input validation error: `inputs` must have less than 256 tokens. Given: {given}",
                              "error_type": "Validation"}
    strict = start_gateway(auto_truncate=False)
    assert httpx.post(f"{strict}/embed", json={"inputs": LONG}).status_code == 422
    assert httpx.post(f"{strict}/embed", json={"inputs": LONG, "truncate": True}).status_code == 200


def test_left_truncation_keeps_the_end(http, direct, tokenizer):
    tok = tokenizer("minilm")
    tail = " and this sentence closes the document"
    text = "the " * 400 + tail.strip()  # "the" is one token
    # The left-truncated token sequence is exactly the tokenization of a shorter text: fewer fillers.
    keep = 256 - 2 - len(tok.encode(tail, add_special_tokens=False).ids)
    shorter = "the " * keep + tail.strip()
    assert len(tok.encode(shorter).ids) == 256 and tok.encode(shorter).ids[1:-1] == tok.encode(text).ids[-255:-1]
    left = http.post("/embed", json={"inputs": text, "truncation_direction": "left"})
    assert left.status_code == 200 and left.headers["x-compute-tokens"] == "256"
    np.testing.assert_allclose(left.json()[0], direct("minilm", [shorter])["dense"][0], atol=1e-5)
    right = http.post("/embed", json={"inputs": text, "truncation_direction": "Right"})
    np.testing.assert_allclose(right.json()[0], direct("minilm", [text])["dense"][0], atol=1e-6)


def test_token_id_inputs(http, direct, tokenizer):
    text = "What is the capital of Germany?"
    ids = tokenizer("minilm").encode(text).ids
    mixed = http.post("/embed", json={"inputs": [ids, "ok"]})
    expected = direct("minilm", [text, "ok"])["dense"]
    np.testing.assert_allclose(mixed.json(), expected, atol=1e-5)
    too_long = http.post("/embed", json={"inputs": [ids * 40], "truncate": False})
    assert too_long.status_code == 422 and f"Given: {len(ids) * 40}" in too_long.json()["error"]
    out_of_vocab = http.post("/embed", json={"inputs": [[101, 10**6, 102]]})
    assert out_of_vocab.status_code == 422


def test_dimensions_and_normalize(http, direct):
    texts = ["What is the capital of Germany?", "ok"]
    full = direct("minilm", texts)["dense"]
    cut = np.array(http.post("/embed", json={"inputs": texts, "dimensions": 16}).json())
    np.testing.assert_allclose(cut, full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True), atol=1e-6)
    raw = np.array(http.post("/embed", json={"inputs": texts, "normalize": False}).json())
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), full, atol=1e-5)
    raw_cut = np.array(http.post("/embed", json={"inputs": texts, "normalize": False, "dimensions": 16}).json())
    np.testing.assert_allclose(raw_cut, raw[:, :16], atol=1e-6)
    for dimensions, status in ((0, 422), (-3, 422), (385, 422)):
        response = http.post("/embed", json={"inputs": "ok", "dimensions": dimensions})
        assert response.status_code == status and response.json()["error_type"] == "Validation"
    assert "`dimensions` should be positive" in http.post("/embed", json={"inputs": "ok", "dimensions": 0}).json()["error"]


def test_wrong_types_and_bodies(http):
    assert http.post("/embed", json={"inputs": 5}).status_code == 422
    assert http.post("/embed", json={"inputs": [1.5, "x"]}).status_code == 422
    assert http.post("/embed", json={"text": "ok"}).status_code == 422
    assert http.post("/embed", json={"inputs": "ok", "truncation_direction": "up"}).status_code == 422
    malformed = http.post("/embed", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error_type"] == "Validation"
    assert http.post("/embed", content=b'{"inputs": "ok"}').status_code == 415
    assert http.post("/embed", content=b'{"inputs": "ok"}', headers={"content-type": "text/plain"}).status_code == 415
    assert http.post("/embed", json={"inputs": "ok", "prompt_name": "query"}).status_code == 422


def test_unknown_and_unsuitable_models(http):
    unknown = http.post("/embed?model=nope", json={"inputs": "ok"})
    assert unknown.status_code == 404 and unknown.json()["error_type"] == "NotFound"
    sparse_on_minilm = http.post("/embed_sparse?model=minilm", json={"inputs": "ok"})
    assert sparse_on_minilm.status_code == 422 and "sparse" in sparse_on_minilm.json()["error"]


def test_sparse_bge_m3(http, direct):
    texts = ["What is BGE M3?", "Berlin is in Germany."]
    body = http.post("/embed_sparse", json={"inputs": texts}).json()  # minilm is the default: bge-m3 is picked
    expected = direct("bge-m3", texts)
    assert len(body) == 2
    for row, terms in enumerate(body):
        ids, weights = expected["sparse_ids"][row], expected["sparse_weights"][row]
        assert terms and all(set(t) == {"index", "value"} for t in terms)
        assert [t["index"] for t in terms] == ids[ids >= 0].tolist()
        np.testing.assert_allclose([t["value"] for t in terms], weights[ids >= 0], atol=1e-6)
        assert all(t["value"] > 0 for t in terms)


def test_colbert_bge_m3(http, direct):
    texts = ["What is BGE M3?", "Berlin is the capital and largest city of Germany."]
    body = http.post("/embed_colbert?model=bge-m3", json={"inputs": texts}).json()
    expected = direct("bge-m3", texts)
    for row, vectors in enumerate(body):
        n = int(expected["num_tokens"][row, 0]) - 1
        assert np.array(vectors).shape == (n, 32)
        np.testing.assert_allclose(vectors, expected["colbert"][row, :n], atol=1e-6)
    assert http.post("/embed_colbert?model=minilm", json={"inputs": "ok"}).status_code == 422


def test_embed_all_matches_sentence_transformers(http, minilm_dir, tokenizer):
    from sentence_transformers import SentenceTransformer

    texts = ["What is the capital of Germany?", "ok"]
    body = http.post("/embed_all", json={"inputs": texts}).json()
    tokens = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, output_value="token_embeddings")
    for row, text in enumerate(texts):
        assert len(body[row]) == len(tokenizer("minilm").encode(text).ids)
        np.testing.assert_allclose(body[row], tokens[row].numpy(), atol=1e-4)
    pooled = np.mean(body[0], axis=0)
    embedded = http.post("/embed", json={"inputs": texts[0]}).json()[0]
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled), embedded, atol=1e-5)


def test_similarity(http, direct):
    source, sentences = "A man is eating food.", ["A man is eating a piece of bread.", "The sky is blue."]
    scores = http.post("/similarity", json={"inputs": {"source_sentence": source, "sentences": sentences}}).json()
    vectors = direct("minilm", [source, *sentences])["dense"]
    expected = vectors[1:] @ vectors[0] / np.linalg.norm(vectors[1:], axis=1) / np.linalg.norm(vectors[0])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    empty = http.post("/similarity", json={"inputs": {"source_sentence": source, "sentences": []}})
    assert empty.status_code == 400
