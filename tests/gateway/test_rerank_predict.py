"""/rerank, /v1/rerank, /predict and SPLADE /embed_sparse, against direct Triton calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

pytestmark = pytest.mark.triton

QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital and largest city of Germany.", "Paris is the capital of France.",
            "The quick brown fox jumps over the lazy dog."]


@pytest.mark.parametrize("model", ["reranker", "msmarco"])
def test_rerank_sorted_scores(http, direct, need, model):
    need(model)
    expected = direct(model, [QUERY] * len(PASSAGES), PASSAGES)
    ranks = http.post(f"/rerank?model={model}", json={"query": QUERY, "texts": PASSAGES}).json()
    order = np.argsort(-expected["scores"][:, 0], kind="stable").tolist()
    assert [r["index"] for r in ranks] == order
    np.testing.assert_allclose([r["score"] for r in ranks], expected["scores"][order, 0], atol=1e-6)
    assert all(set(r) == {"index", "score"} for r in ranks)
    raw = http.post(f"/rerank?model={model}", json={"query": QUERY, "texts": PASSAGES, "raw_scores": True,
                                                    "return_text": True}).json()
    np.testing.assert_allclose([r["score"] for r in raw], expected["logits"][order, 0], atol=1e-5)
    assert [r["text"] for r in raw] == [PASSAGES[i] for i in order]


def test_rerank_in_vllms_and_infinitys_shape(http, direct, tokenizer):
    """vLLM's and Infinity's body (`documents`; Infinity's `return_documents`, `top_n`, `raw_scores`) gets
    their answer: each document as vLLM's `{"text"}`, or Infinity's string when asked for."""
    expected = direct("msmarco", [QUERY] * len(PASSAGES), PASSAGES)
    order = np.argsort(-expected["scores"][:, 0], kind="stable").tolist()
    body = {"query": QUERY, "documents": PASSAGES, "model": "msmarco"}
    answer = http.post("/rerank", json=body).json()
    assert answer["object"] == "rerank" and answer["model"] == "msmarco" and answer["id"] and answer["created"]
    assert [r["index"] for r in answer["results"]] == order
    assert [r["document"] for r in answer["results"]] == [{"text": PASSAGES[i]} for i in order]
    np.testing.assert_allclose([r["relevance_score"] for r in answer["results"]], expected["scores"][order, 0], atol=1e-6)
    pair = tokenizer("msmarco")
    assert answer["usage"]["prompt_tokens"] == sum(len(pair.encode(QUERY, p).ids) for p in PASSAGES)
    top = http.post("/rerank", json={**body, "top_n": 2, "raw_scores": True, "return_documents": True}).json()["results"]
    assert [r["document"] for r in top] == [PASSAGES[i] for i in order[:2]]
    np.testing.assert_allclose([r["relevance_score"] for r in top], expected["logits"][order[:2], 0], atol=1e-5)
    assert [r["index"] for r in http.post("/rerank", json={"query": QUERY, "texts": PASSAGES, "model": "msmarco",
                                                            "top_n": 1}).json()] == order[:1]
    # vLLM's body (`documents`) refused as vLLM refuses it (400), TEI's as TEI (422)
    for wrong, status in (({**body, "texts": PASSAGES}, 400), ({"query": QUERY, "model": "msmarco"}, 422),
                          ({**body, "return_text": True}, 400),
                          ({"query": QUERY, "texts": PASSAGES, "return_documents": True}, 422),
                          ({**body, "top_n": 0}, 400)):
        assert http.post("/rerank", json=wrong).status_code == status, wrong


def test_score_in_vllms_shape(http, direct):
    """vLLM's `/score` body: a reranker's sigmoid scores of the pairs, an embedder's cosine similarity."""
    expected = direct("msmarco", [QUERY] * len(PASSAGES), PASSAGES)["scores"][:, 0]
    answer = http.post("/score", json={"model": "msmarco", "text_1": QUERY, "text_2": PASSAGES}).json()
    assert answer["object"] == "list" and answer["model"] == "msmarco" and answer["usage"]["prompt_tokens"] > 0
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    np.testing.assert_allclose([d["score"] for d in answer["data"]], expected, atol=1e-6)
    pairwise = http.post("/score", json={"model": "msmarco", "queries": [QUERY, PASSAGES[1]],
                                         "documents": PASSAGES[:2]}).json()["data"]
    np.testing.assert_allclose([d["score"] for d in pairwise],
                               direct("msmarco", [QUERY, PASSAGES[1]], PASSAGES[:2])["scores"][:, 0], atol=1e-6)
    vectors = direct("minilm", [QUERY, *PASSAGES])["dense"]
    cosine = http.post("/score", json={"model": "minilm", "text_1": [QUERY], "text_2": PASSAGES}).json()["data"]
    np.testing.assert_allclose([d["score"] for d in cosine], vectors[1:] @ vectors[0], atol=1e-5)
    for wrong in ({"model": "msmarco", "text_1": QUERY, "text_2": PASSAGES, "query": QUERY},
                  {"model": "msmarco", "text_1": [QUERY, QUERY], "text_2": PASSAGES},
                  {"model": "msmarco", "text_1": QUERY, "queries": QUERY, "text_2": PASSAGES},
                  {"model": "msmarco", "text_1": QUERY},
                  {"model": "splade", "text_1": QUERY, "text_2": PASSAGES}):
        refused = http.post("/score", json=wrong)  # as vLLM refuses a bad request
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "BadRequestError", wrong
    assert http.post("/score", json={"model": "msmarco", "text_1": QUERY, "text_2": []}).status_code == 400


def test_rerank_errors_and_truncation(http, direct, need, tokenizer):
    need("reranker")
    empty = http.post("/rerank?model=reranker", json={"query": QUERY, "texts": []})
    assert empty.status_code == 400 and empty.json()["error_type"] == "Empty"
    assert http.post("/rerank?model=minilm", json={"query": QUERY, "texts": PASSAGES}).status_code == 422
    long_passage = "Berlin is the capital and largest city of Germany. " * 80
    # A too-long passage is cut on the right, as Triton's tokenize stage does itself.
    ranks = http.post("/rerank?model=reranker", json={"query": QUERY, "texts": [long_passage]}).json()
    np.testing.assert_allclose(ranks[0]["score"], direct("reranker", [QUERY], [long_passage])["scores"][0, 0], atol=1e-5)
    refused = http.post("/rerank?model=reranker", json={"query": QUERY, "texts": [long_passage], "truncate": False})
    assert refused.status_code == 422 and "must have less than" in refused.json()["error"]


def gateway_tokenizations(http) -> float:
    """How many requests the gateway tokenized itself (its tokenization histogram's count)."""
    return next(float(line.split()[-1]) for line in http.get("/metrics").text.splitlines()
                if line.startswith("te_request_tokenization_duration_count"))


# The peers' case: a query far past the window beside short documents.
LONG_QUERY = "What is the capital of France? " * 100
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow and rich in potassium.",
             "Berlin is the capital and largest city of Germany. " * 80]


def cross_encoder_scores(directory: Path, query: str, documents: list[str], side: str = "right") -> np.ndarray:
    """sentence-transformers' CrossEncoder on the same weights (sigmoid scores); `left` through
    transformers, which CrossEncoder does not offer."""
    import torch

    if side == "right":
        from sentence_transformers import CrossEncoder

        return np.asarray(CrossEncoder(str(directory), max_length=512).predict([(query, d) for d in documents]))
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, truncation_side="left")
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    encoded = tokenizer([query] * len(documents), documents, padding=True, truncation=True, max_length=512,
                        return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**encoded).logits[:, 0]).numpy()


def test_a_long_query_keeps_every_document_on_every_rerank_route(http, need, reranker_dir):
    """Pairs are cut longest-first, as TEI and CrossEncoder cut them, by Triton's tokenize stage: the
    documents stay and score apart, on the text path (the gateway does not tokenize them)."""
    need("reranker")
    want = cross_encoder_scores(reranker_dir, LONG_QUERY, DOCUMENTS)
    # the tiny reranker reads a document faintly beside 500 query tokens: close scores, compared closely
    assert np.abs(want[0] - want[1]) > 5e-6, "random weights must still tell the documents apart"
    before = gateway_tokenizations(http)
    body = {"model": "reranker", "query": LONG_QUERY}
    tei = http.post("/rerank", json={**body, "texts": DOCUMENTS, "truncate": True}).json()
    cohere = http.post("/v1/rerank", json={**body, "documents": DOCUMENTS}).json()["results"]
    vllm = http.post("/score", json={"model": "reranker", "text_1": LONG_QUERY, "text_2": DOCUMENTS}).json()["data"]
    assert gateway_tokenizations(http) == before
    for got in ([r["score"] for r in sorted(tei, key=lambda r: r["index"])],
                [r["relevance_score"] for r in sorted(cohere, key=lambda r: r["index"])],
                [r["score"] for r in sorted(vllm, key=lambda r: r["index"])]):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_left_truncation_cuts_pairs_longest_first_in_the_gateway(http, need, reranker_dir):
    need("reranker")
    want = cross_encoder_scores(reranker_dir, LONG_QUERY, DOCUMENTS, side="left")
    before = gateway_tokenizations(http)
    got = http.post("/rerank?model=reranker", json={"query": LONG_QUERY, "texts": DOCUMENTS,
                                                     "truncation_direction": "left"}).json()
    assert gateway_tokenizations(http) == before + 1
    np.testing.assert_allclose([r["score"] for r in sorted(got, key=lambda r: r["index"])], want, atol=1e-6)


def test_v1_rerank(http, direct, need):
    need("reranker")
    expected = direct("reranker", [QUERY] * len(PASSAGES), PASSAGES)
    documents = [PASSAGES[0], {"text": PASSAGES[1]}, PASSAGES[2]]
    body = http.post("/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": documents, "top_n": 2}).json()
    order = np.argsort(-expected["scores"][:, 0], kind="stable").tolist()[:2]
    assert body["model"] == "reranker" and [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], expected["scores"][order, 0], atol=1e-6)
    assert [r["document"]["text"] for r in body["results"]] == [PASSAGES[i] for i in order]
    assert body["usage"]["total_tokens"] == int(expected["num_tokens"].sum())
    bare = http.post("/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": PASSAGES,
                                         "return_documents": False}).json()
    assert all("document" not in r for r in bare["results"]) and len(bare["results"]) == 3
    missing = http.post("/v1/rerank", json={"model": "nope", "query": QUERY, "documents": PASSAGES})
    assert missing.status_code == 404 and missing.json()["type"] == "NotFound"


def test_predict_single_pair_and_batch(http, direct, need):
    need("classifier")
    labels = ["negative", "neutral", "positive"]
    single = http.post("/predict?model=classifier", json={"inputs": "I love Berlin."}).json()
    expected = direct("classifier", ["I love Berlin."])["scores"][0]
    assert [p["label"] for p in single] == [labels[i] for i in np.argsort(-expected, kind="stable")]
    np.testing.assert_allclose([p["score"] for p in single], np.sort(expected)[::-1], atol=1e-6)
    pair = http.post("/predict?model=classifier", json={"inputs": ["I love Berlin.", "Berlin loves me."]}).json()
    pair_expected = direct("classifier", ["I love Berlin."], ["Berlin loves me."])["scores"][0]
    np.testing.assert_allclose(sorted(p["score"] for p in pair), np.sort(pair_expected), atol=1e-6)
    batch = http.post("/predict?model=classifier", json={"inputs": [["I love Berlin."], ["I love Berlin.", "Berlin loves me."]],
                                                         "raw_scores": True}).json()
    assert len(batch) == 2
    logits = direct("classifier", ["I love Berlin."])["logits"][0]
    np.testing.assert_allclose(sorted(p["score"] for p in batch[0]), np.sort(logits), atol=1e-5)
    assert http.post("/predict?model=classifier", json={"inputs": ["a", "b", "c"]}).status_code == 422
    assert http.post("/predict?model=classifier", json={"inputs": []}).status_code == 400


def onnx_scores(export: Path, texts: list[str]) -> np.ndarray:
    """The exported cross-encoder's sigmoid scores for lone texts, by onnxruntime on the export's own graph."""
    import onnxruntime as ort

    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    tok.no_truncation()
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    scores = []
    for text in texts:
        encoding = tok.encode(text)
        feed = {"input_ids": [encoding.ids], "attention_mask": [encoding.attention_mask],
                "token_type_ids": [encoding.type_ids]}
        names = {i.name for i in session.get_inputs()}
        logits = session.run(None, {k: np.asarray(v, dtype=np.int64) for k, v in feed.items() if k in names})[0]
        scores.append(1 / (1 + np.exp(-logits[0, 0])))
    return np.asarray(scores)


@pytest.mark.parametrize("model", ["reranker", "msmarco", "msmarco-fused"])
def test_predict_reranker_scores_lone_texts_and_pairs(http, direct, need, exports, model):
    """TEI scores a lone text on a reranker as a sequence of its own; prensa's ensemble takes pairs,
    so the gateway tokenizes the lone text and calls the encoder and pool stages."""
    need(model.removesuffix("-fused"))
    texts = ["just one text", "Berlin is the capital and largest city of Germany."]
    expected = onnx_scores(exports[model.removesuffix("-fused")], texts)
    lone = http.post(f"/predict?model={model}", json={"inputs": texts[0]}).json()
    np.testing.assert_allclose(lone[0]["score"], expected[0], atol=1e-5)
    batch = http.post(f"/predict?model={model}", json={"inputs": [[texts[0]], [QUERY, PASSAGES[0]], [texts[1]]]}).json()
    np.testing.assert_allclose([batch[0][0]["score"], batch[2][0]["score"]], expected, atol=1e-5)
    np.testing.assert_allclose(batch[1][0]["score"], direct(model, [QUERY], [PASSAGES[0]])["scores"][0, 0], atol=1e-6)


def test_splade_sparse(http, direct, need):
    need("splade")
    texts = ["What is the capital of Germany?", "Berlin"]
    body = http.post("/embed_sparse?model=splade", json={"inputs": texts}).json()
    expected = direct("splade", texts)
    for row, terms in enumerate(body):
        ids = expected["sparse_ids"][row]
        assert [t["index"] for t in terms] == ids[ids >= 0].tolist()
        np.testing.assert_allclose([t["value"] for t in terms], expected["sparse_weights"][row][ids >= 0], atol=1e-5)
    assert http.post("/embed?model=splade", json={"inputs": "ok"}).status_code == 422


def test_info_model_types(http, need):
    for model in ("reranker", "classifier", "splade"):
        need(model)
    assert http.get("/info?model=splade").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    reranker = http.get("/info?model=reranker").json()["model_type"]
    assert reranker == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    classifier = http.get("/info?model=classifier").json()["model_type"]["classifier"]
    assert classifier["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
