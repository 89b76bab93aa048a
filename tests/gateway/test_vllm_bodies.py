"""vLLM's request options and bodies against a real gateway and Triton, each compared with an
independent reference: sentence-transformers for a window of tokens, direct Triton calls for scores,
the model's tokenizer for `/tokenize`."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.triton

TEXT = "Berlin is the capital and largest city of Germany, on the river Spree."
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital and largest city of Germany.", "Paris is the capital of France."]


def test_a_window_of_tokens_embeds_as_sentence_transformers_cut_there(http, minilm_dir):
    """vLLM's `truncate_prompt_tokens` k is sentence-transformers' `max_seq_length` k: the first k
    tokens, [CLS] and [SEP] included."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    for window in (6, 12):
        model.max_seq_length = window
        want = model.encode([TEXT], normalize_embeddings=True)
        answer = http.post("/v1/embeddings", json={"model": "minilm", "input": [TEXT],
                                                   "truncate_prompt_tokens": window}).json()
        assert answer["usage"]["prompt_tokens"] == window
        np.testing.assert_allclose([answer["data"][0]["embedding"]], want, atol=1e-5)
    raw = http.post("/v1/embeddings", json={"model": "minilm", "input": [TEXT], "normalize": False}).json()
    model.max_seq_length = 256
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu")  # without its Normalize module
    assert type(model[2]).__name__ == "Normalize"
    np.testing.assert_allclose([raw["data"][0]["embedding"]], pooled.encode([TEXT]), atol=1e-5)


def test_score_names_and_activation_as_vllm_gives_them(http, direct):
    expected = direct("msmarco", [QUERY] * 2, PASSAGES)
    for first, second in (("data_1", "data_2"), ("queries", "items")):
        logits = http.post("/score", json={"model": "msmarco", first: QUERY, second: PASSAGES,
                                           "use_activation": False}).json()["data"]
        np.testing.assert_allclose([d["score"] for d in logits], expected["logits"][:, 0], atol=1e-5)
    ranked = http.post("/rerank", json={"model": "msmarco", "query": QUERY, "documents": PASSAGES}).json()
    order = np.argsort(-expected["scores"][:, 0], kind="stable").tolist()
    assert [r["document"] for r in ranked["results"]] == [{"text": PASSAGES[i]} for i in order]


def test_tokenize_with_vllms_body(http, tokenizer):
    ids = tokenizer("minilm").encode(TEXT).ids
    answer = http.post("/tokenize", json={"model": "minilm", "prompt": TEXT, "return_token_strs": True}).json()
    assert answer["tokens"] == ids and answer["count"] == len(ids) and len(answer["token_strs"]) == len(ids)
    via_invocations = http.post("/invocations", json={"model": "minilm", "input": [TEXT]}).json()
    direct_route = http.post("/v1/embeddings", json={"model": "minilm", "input": [TEXT]}).json()
    np.testing.assert_allclose(via_invocations["data"][0]["embedding"], direct_route["data"][0]["embedding"],
                               atol=1e-6)
