"""Every inference route of the gateway answers, over the in-process backend, what the stage code
computes for the same inputs (the `oracle`: tokenize stage, onnxruntime, pool stage, called here)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from prensa.stages import contract
from tests.fast.conftest import FUSED, MAX_LENGTH, MODELS, VOCAB

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Berlin is the capital of Germany", "dense vectors"]
QUERY = "capital of france"
PASSAGES = ["Paris is the capital of France.", "The lazy dog sleeps.", "Berlin is a city in Germany."]
ATOL = 1e-5


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_health_info_and_model_list(http):
    assert http.get("/health").status_code == 200
    info = http.get("/info").json()
    assert info["served_model_name"] == "embed" and info["model_id"] == "prensa-fast/embed"
    assert info["max_input_length"] == MAX_LENGTH and info["max_batch_requests"] == 64
    assert {m["served_model_name"] for m in info["models"]} == {*MODELS, *FUSED}
    listed = http.get("/v1/models").json()
    assert sorted(card["id"] for card in listed["data"]) == sorted([*MODELS, *FUSED])
    card = http.get("/v1/models/rerank").json()
    assert card["task"] == "rerank" and card["max_model_len"] == MAX_LENGTH
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and "te_request_count" in metrics.text


@pytest.mark.parametrize("model", ["embed", "embed-fused", "m3"])
def test_embed_equals_the_stage_code(http, oracle, model):
    response = http.post("/embed", json={"inputs": TEXTS, "model": model})
    assert response.status_code == 200, response.text
    expected = oracle(model)(TEXTS)
    np.testing.assert_allclose(response.json(), expected[contract.DENSE], atol=ATOL)
    assert int(response.headers["x-compute-tokens"]) == int(expected[contract.NUM_TOKENS].sum())


def test_embed_unnormalised_token_ids_and_dimensions(http, oracle):
    want = oracle("embed")
    tokens = want.tokens(TEXTS)
    hidden = want.encoded(tokens)[contract.LAST_HIDDEN_STATE]
    raw = http.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()  # pooled by the gateway
    mask = tokens[contract.ATTENTION_MASK]
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(raw, mean, atol=ATOL)
    # token ids take the token path (`<name>_encode` then `<name>_pool`): the same vectors
    ids = [row[: int(m.sum())].tolist() for row, m in zip(tokens[contract.INPUT_IDS], mask)]
    by_ids = http.post("/embed", json={"inputs": ids}).json()
    np.testing.assert_allclose(by_ids, want(TEXTS)[contract.DENSE], atol=ATOL)
    cut = np.asarray(http.post("/embed", json={"inputs": TEXTS, "dimensions": 4}).json())
    full = want(TEXTS)[contract.DENSE][:, :4]
    np.testing.assert_allclose(cut, full / np.linalg.norm(full, axis=1, keepdims=True), atol=ATOL)


def test_left_truncation_takes_the_token_path(http, oracle):
    long = " ".join(["river"] * (MAX_LENGTH * 2) + ["dog"])
    left = http.post("/embed", json={"inputs": long, "truncation_direction": "left"}).json()
    kept = " ".join(["river"] * (MAX_LENGTH - 3) + ["dog"])  # [CLS] + 22 words + [SEP] = MAX_LENGTH
    np.testing.assert_allclose(left, oracle("embed")([kept])[contract.DENSE], atol=ATOL)
    right = http.post("/embed", json={"inputs": long}).json()
    np.testing.assert_allclose(right, oracle("embed")([long])[contract.DENSE], atol=ATOL)
    refused = http.post("/embed", json={"inputs": long, "truncate": False})
    assert refused.status_code == 422, refused.text


def sparse_of(expected: dict[str, np.ndarray], row: int) -> list[tuple[int, float]]:
    ids, weights = expected[contract.SPARSE_IDS][row], expected[contract.SPARSE_WEIGHTS][row]
    return [(int(i), float(w)) for i, w in zip(ids, weights) if i >= 0]


@pytest.mark.parametrize("model", ["splade", "m3"])
def test_embed_sparse_equals_the_stage_code(http, oracle, model):
    response = http.post("/embed_sparse", json={"inputs": TEXTS, "model": model})
    assert response.status_code == 200, response.text
    expected = oracle(model)(TEXTS)
    for row, got in enumerate(response.json()):
        want = sparse_of(expected, row)
        assert [g["index"] for g in got] == [i for i, _ in want]
        np.testing.assert_allclose([g["value"] for g in got], [w for _, w in want], atol=ATOL)


def test_colbert_and_hidden_states(http, oracle):
    expected = oracle("m3")(TEXTS)
    colbert = http.post("/embed_colbert", json={"inputs": TEXTS, "model": "m3"}).json()
    for row, got in enumerate(colbert):
        n = int(expected[contract.NUM_TOKENS][row, 0])
        assert len(got) == n - 1
        np.testing.assert_allclose(got, expected[contract.COLBERT][row, : n - 1], atol=ATOL)
    want = oracle("embed")
    tokens = want.tokens(TEXTS)
    hidden = want.encoded(tokens)[contract.LAST_HIDDEN_STATE]
    every = http.post("/embed_all", json={"inputs": TEXTS}).json()
    for row, got in enumerate(every):
        n = int(tokens[contract.ATTENTION_MASK][row].sum())
        np.testing.assert_allclose(got, hidden[row, :n], atol=ATOL)


def test_rerank_equals_the_stage_code(http, oracle):
    logits = oracle("rerank")([QUERY] * len(PASSAGES), PASSAGES)[contract.LOGITS][:, 0]
    body = {"query": QUERY, "texts": PASSAGES, "model": "rerank", "return_text": True}
    ranks = http.post("/rerank", json=body).json()
    assert [r["index"] for r in ranks] == np.argsort(-logits, kind="stable").tolist()
    for rank in ranks:
        assert rank["text"] == PASSAGES[rank["index"]]
        assert rank["score"] == pytest.approx(float(sigmoid(logits[rank["index"]])), abs=ATOL)
    raw = http.post("/rerank", json={**body, "raw_scores": True}).json()
    assert {r["index"]: r["score"] for r in raw} == pytest.approx(dict(enumerate(logits.tolist())), abs=ATOL)
    # NIM: raw logits, best first; Cohere v1 and v2: sigmoid relevance scores
    nim = http.post("/v1/ranking", json={"model": "rerank", "query": {"text": QUERY},
                                         "passages": [{"text": p} for p in PASSAGES]}).json()
    assert [(r["index"], pytest.approx(r["logit"], abs=ATOL)) for r in nim["rankings"]] == [
        (r["index"], r["score"]) for r in raw]
    for path in ("/v1/rerank", "/v2/rerank"):
        cohere = http.post(path, json={"model": "rerank", "query": QUERY, "documents": PASSAGES, "top_n": 2}).json()
        assert [r["index"] for r in cohere["results"]] == [r["index"] for r in ranks][:2]
        for result in cohere["results"]:
            assert result["relevance_score"] == pytest.approx(float(sigmoid(logits[result["index"]])), abs=ATOL)


def test_pooling_answers_as_vllm_from_the_stage_code(http, oracle):
    """vLLM's `/pooling`: `embed` is each text's pooled, L2-normalised vector (float or base64 float32),
    `token_embed` the encoder's vector of each of its tokens."""
    expected = oracle("embed")(TEXTS)
    pooled = http.post("/pooling", json={"input": TEXTS, "model": "embed"}).json()
    assert pooled["object"] == "list" and pooled["id"].startswith("pool-") and pooled["usage"]["completion_tokens"] == 0
    got = np.asarray([row["data"] for row in sorted(pooled["data"], key=lambda row: row["index"])])
    np.testing.assert_allclose(got, expected[contract.DENSE], atol=ATOL)
    packed = http.post("/pooling", json={"input": TEXTS, "model": "embed", "encoding_format": "base64"}).json()
    unpacked = [np.frombuffer(base64.b64decode(row["data"]), dtype="<f4") for row in packed["data"]]
    np.testing.assert_allclose(unpacked, got, atol=1e-7)
    tokens = http.post("/pooling", json={"input": TEXTS[:2], "model": "embed", "task": "token_embed"}).json()
    hidden = oracle("embed").encoded(oracle("embed").tokens(TEXTS))[contract.LAST_HIDDEN_STATE]
    for row, answer in enumerate(tokens["data"]):
        count = int(expected[contract.NUM_TOKENS][row][0])
        np.testing.assert_allclose(np.asarray(answer["data"]), hidden[row, :count], atol=ATOL)
    refused = http.post("/pooling", json={"input": "dog", "task": "token_embed", "encoding_format": "base64"})
    assert refused.status_code == 400 and "base64" in refused.json()["error"]["message"]  # vLLM's answer


def test_classify_answers_vllm_and_infinity_each_in_its_shape(http, oracle):
    """vLLM's body gets vLLM's answer (each input's probabilities and its best label), Infinity's
    (with `raw_scores`) Infinity's (every label by score, logits when asked); both from the stage code."""
    labels = ["negative", "neutral", "positive"]
    scores, logits = oracle("classify")(TEXTS)[contract.SCORES], oracle("classify")(TEXTS)[contract.LOGITS]
    vllm = http.post("/classify", json={"input": TEXTS, "model": "classify"}).json()
    assert vllm["object"] == "list" and vllm["id"].startswith("classify-") and vllm["usage"]["completion_tokens"] == 0
    for row, got in enumerate(vllm["data"]):
        assert (got["index"], got["num_classes"], got["label"]) == (row, 3, labels[int(np.argmax(scores[row]))])
        assert got["probs"] == pytest.approx(scores[row].tolist(), abs=ATOL)
    one = http.post("/classify", json={"input": TEXTS[0], "model": "classify", "truncate_prompt_tokens": -1}).json()
    assert len(one["data"]) == 1 and one["data"][0]["probs"] == pytest.approx(scores[0].tolist(), abs=ATOL)
    for raw, expected in ((False, scores), (True, logits)):
        infinity = http.post("/classify", json={"input": TEXTS, "model": "classify", "raw_scores": raw}).json()
        assert infinity["object"] == "classify"
        for row, got in enumerate(infinity["data"]):
            assert [p["score"] for p in got] == sorted((p["score"] for p in got), reverse=True)
            assert {p["label"]: p["score"] for p in got} == pytest.approx(dict(zip(labels, expected[row].tolist())),
                                                                           abs=ATOL)
    too_long = http.post("/classify", json={"input": "dog", "model": "classify",
                                            "truncate_prompt_tokens": MAX_LENGTH + 1})
    assert too_long.status_code == 400 and "truncate_prompt_tokens" in too_long.json()["error"]["message"]


def test_predict_equals_the_stage_code(http, oracle):
    expected = oracle("classify")(TEXTS)[contract.SCORES]
    predictions = http.post("/predict", json={"inputs": [[t] for t in TEXTS], "model": "classify"}).json()
    labels = ["negative", "neutral", "positive"]
    for row, got in enumerate(predictions):
        assert {p["label"]: p["score"] for p in got} == pytest.approx(dict(zip(labels, expected[row].tolist())),
                                                                       abs=ATOL)
    pairs = [[QUERY, p] for p in PASSAGES]
    paired = http.post("/predict", json={"inputs": pairs, "model": "classify", "raw_scores": True}).json()
    logits = oracle("classify")([QUERY] * 3, PASSAGES)[contract.LOGITS]
    for row, got in enumerate(paired):
        assert {p["label"]: p["score"] for p in got} == pytest.approx(dict(zip(labels, logits[row].tolist())),
                                                                       abs=ATOL)


def test_similarity_is_the_cosine_of_the_stage_vectors(http, oracle):
    vectors = oracle("embed")([QUERY, *PASSAGES])[contract.DENSE]
    got = http.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": PASSAGES}}).json()
    np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=ATOL)


def test_tokenize_and_decode(http):
    tokens = http.post("/tokenize", json={"inputs": ["Berlin is a city"]}).json()[0]
    assert [t["id"] for t in tokens] == [VOCAB[w] for w in ("[CLS]", "berlin", "is", "a", "city", "[SEP]")]
    assert [t["special"] for t in tokens] == [True, False, False, False, False, True]
    assert tokens[1]["start"] == 0 and tokens[1]["stop"] == len("Berlin")
    ids = [t["id"] for t in tokens]
    assert http.post("/decode", json={"ids": ids}).json() == ["berlin is a city"]
    assert http.post("/decode", json={"ids": [ids], "skip_special_tokens": False}).json() == [
        "[CLS] berlin is a city [SEP]"]


def test_openai_and_cohere_embeddings(http, oracle):
    expected = oracle("embed")(TEXTS)
    answer = http.post("/v1/embeddings", json={"input": TEXTS, "model": "embed"}).json()
    assert answer["model"] == "embed" and [d["index"] for d in answer["data"]] == [0, 1, 2]
    np.testing.assert_allclose([d["embedding"] for d in answer["data"]], expected[contract.DENSE], atol=ATOL)
    assert answer["usage"]["prompt_tokens"] == int(expected[contract.NUM_TOKENS].sum())
    packed = http.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()
    unpacked = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32) for d in packed["data"]]
    np.testing.assert_allclose(unpacked, expected[contract.DENSE], atol=ATOL)
    cohere = http.post("/v2/embed", json={"texts": TEXTS, "model": "embed", "input_type": "search_document",
                                          "embedding_types": ["float"]}).json()
    assert cohere["response_type"] == "embeddings_by_type" and cohere["texts"] == TEXTS
    np.testing.assert_allclose(cohere["embeddings"]["float"], expected[contract.DENSE], atol=ATOL)


def test_the_default_route_answers_with_the_default_model(http, oracle):
    got = http.post("/", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(got, oracle("embed")(TEXTS)[contract.DENSE], atol=ATOL)


@pytest.mark.parametrize(("path", "body"), [("/embed", {"inputs": "dog", "model": "m3"}),
                                            ("/v1/embeddings", {"input": "dog", "model": "m3"})])
def test_dimensions_cut_only_where_the_model_declares_matryoshka(http, start_gateway, path, body):
    """As vLLM: a model that declares no Matryoshka sizes is not cut (400 naming it), one that lists
    sizes is cut to those only, the full size is always served, and the operator may allow any."""
    refused = http.post(path, json={**body, "dimensions": 4})
    assert refused.status_code == 400 and "declares no Matryoshka dimensions" in refused.text, refused.text
    assert http.post(path, json={**body, "dimensions": 8}).status_code == 200  # its full size: nothing cut
    listed = {**body, "model": "embed"}
    assert http.post(path, json={**listed, "dimensions": 4}).status_code == 200
    wrong = http.post(path, json={**listed, "dimensions": 2})
    assert wrong.status_code == 400 and "cut to 4 dimensions, not 2" in wrong.text, wrong.text
    allowed = start_gateway(allow_any_dimensions=True)
    assert allowed.post(path, json={**body, "dimensions": 4}).status_code == 200
