"""bge-m3 in one call and its hybrid scores, through the gateway and Triton, against FlagEmbedding
on the same tiny bge-m3 weights: `/embed_m3` equals the separate routes, `/score` equals
`BGEM3FlagModel.compute_score` in every mode under two weightings, and a bge-m3 model reranks
on `/rerank` and Cohere's `/v1/rerank` with the `colbert+sparse+dense` score."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytestmark = pytest.mark.triton

QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital and largest city of Germany.", "Paris is the capital of France.",
            "Bananas are rich in potassium.", "Germany's capital is Berlin, on the Spree.",
            "The weather in Berlin is mild in spring. " * 20]
MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")


@pytest.fixture(scope="module")
def flag_model(m3_dir):
    from FlagEmbedding import BGEM3FlagModel

    return BGEM3FlagModel(str(m3_dir), use_fp16=False, devices="cpu")


def flag_scores(flag_model, weights):
    """compute_score of each pair alone: in one batch, FlagEmbedding's ColBERT max also runs over
    the zero vectors of padding, which depends on the batch's neighbours."""
    per_pair = [flag_model.compute_score([(QUERY, p)], max_query_length=512, max_passage_length=512,
                                         weights_for_different_modes=weights) for p in PASSAGES]
    return {mode: [float(np.ravel(one[mode])[0]) for one in per_pair] for mode in MODES}


def test_embed_m3_equals_the_separate_routes(http):
    texts = [QUERY, *PASSAGES[:3]]
    together = http.post("/embed_m3?model=bge-m3", json={"inputs": texts})
    assert together.status_code == 200, together.text
    rows = together.json()
    dense = http.post("/embed?model=bge-m3", json={"inputs": texts}).json()
    sparse = http.post("/embed_sparse?model=bge-m3", json={"inputs": texts}).json()
    colbert = http.post("/embed_colbert?model=bge-m3", json={"inputs": texts}).json()
    for row, d, s, c in zip(rows, dense, sparse, colbert):
        np.testing.assert_allclose(row["dense"], d, atol=1e-6)
        assert [w["index"] for w in row["sparse"]] == [w["index"] for w in s]
        np.testing.assert_allclose([w["value"] for w in row["sparse"]], [w["value"] for w in s], atol=1e-6)
        np.testing.assert_allclose(row["colbert"], c, atol=1e-6)
        assert row["num_tokens"] == len(c) + 1
    only_dense = http.post("/embed", json={"inputs": texts, "model": "bge-m3", "outputs": ["dense"]}).json()
    assert [set(row) for row in only_dense] == [{"dense", "num_tokens"}] * len(texts)
    np.testing.assert_allclose([row["dense"] for row in only_dense], dense, atol=1e-6)


def test_embed_m3_tokens_and_base64_colbert(http, flag_model):
    body = {"inputs": PASSAGES[:2], "outputs": ["sparse", "colbert"], "return_tokens": True,
            "colbert_encoding": "base64_float16", "model": "bge-m3"}
    rows = http.post("/embed_m3", json=body).json()
    floats = http.post("/embed_colbert?model=bge-m3", json={"inputs": PASSAGES[:2]}).json()
    for row, expected in zip(rows, floats):
        blob = row["colbert"]
        assert blob["encoding"] == "base64_float16" and blob["shape"] == [len(expected), len(expected[0])]
        vectors = np.frombuffer(base64.b64decode(blob["data"]), dtype="<f2").reshape(blob["shape"])
        np.testing.assert_allclose(vectors, expected, atol=2e-3)
        ids = {str(w["index"]): w["value"] for w in row["sparse"]}
        by_token = flag_model.convert_id_to_token(ids)
        assert {w["token"]: w["value"] for w in row["sparse"]} == by_token


@pytest.mark.parametrize("weights", [None, [0.2, 0.5, 0.3]])
def test_score_equals_flagembedding_compute_score(http, flag_model, weights):
    response = http.post("/score", json={"query": QUERY, "passages": PASSAGES, "model": "bge-m3",
                                         **({"weights": weights} if weights else {})})
    assert response.status_code == 200, response.text
    got = response.json()
    assert [row["index"] for row in got] == list(range(len(PASSAGES)))
    expected = flag_scores(flag_model, weights or [0.4, 0.2, 0.4])
    for mode in MODES:
        np.testing.assert_allclose([row[mode] for row in got], expected[mode], atol=1e-4, err_msg=mode)


def test_bge_m3_reranks_with_the_hybrid_score(http, flag_model):
    expected = flag_scores(flag_model, [0.4, 0.2, 0.4])["colbert+sparse+dense"]
    ranks = http.post("/rerank?model=bge-m3", json={"query": QUERY, "texts": PASSAGES}).json()
    assert [r["index"] for r in ranks] == list(np.argsort(-np.asarray(expected), kind="stable"))
    np.testing.assert_allclose([r["score"] for r in sorted(ranks, key=lambda r: r["index"])], expected, atol=1e-4)
    weighted = flag_scores(flag_model, [0.0, 1.0, 0.0])["colbert+sparse+dense"]
    sparse_only = http.post("/rerank", json={"model": "bge-m3", "query": QUERY, "texts": PASSAGES,
                                             "weights": [0.0, 1.0, 0.0]}).json()
    np.testing.assert_allclose([r["score"] for r in sorted(sparse_only, key=lambda r: r["index"])], weighted,
                               atol=1e-4)
    cohere = http.post("/v1/rerank", json={"model": "bge-m3", "query": QUERY, "documents": PASSAGES}).json()
    np.testing.assert_allclose([r["relevance_score"] for r in sorted(cohere["results"], key=lambda r: r["index"])],
                               expected, atol=1e-4)
    # the hybrid score has no activation: raw_scores leaves it as it is
    raw = http.post("/rerank", json={"model": "bge-m3", "query": QUERY, "texts": PASSAGES, "raw_scores": True})
    assert raw.status_code == 200, raw.text
    np.testing.assert_allclose([r["score"] for r in sorted(raw.json(), key=lambda r: r["index"])], expected,
                               atol=1e-4)


def test_rerank_without_a_model_stays_on_the_cross_encoder(http, direct):
    """bge-m3 answers the rerank routes only when named (or alone): a cross-encoder is preferred."""
    ranks = http.post("/rerank", json={"query": QUERY, "texts": PASSAGES[:2]}).json()
    got = np.asarray([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    cross_encoders = [direct(name, [QUERY] * 2, PASSAGES[:2])["scores"][:, 0] for name in ("reranker", "msmarco")]
    assert any(np.allclose(got, scores, atol=1e-5) for scores in cross_encoders), (got, cross_encoders)


def test_hybrid_errors(http):
    assert http.post("/score", json={"query": QUERY, "passages": [], "model": "bge-m3"}).status_code == 400
    bad = http.post("/score", json={"query": QUERY, "passages": PASSAGES[:1], "model": "bge-m3",
                                    "weights": [0, 0, 1]})
    assert bad.status_code == 422 and "weights" in bad.json()["error"]
    assert http.post("/score", json={"query": QUERY, "passages": ["x"], "model": "minilm"}).status_code == 422
    refused = http.post("/rerank", json={"query": QUERY, "texts": ["x"], "weights": [1, 1, 1]})  # a cross-encoder
    assert refused.status_code == 422 and "weights" in refused.json()["error"]
