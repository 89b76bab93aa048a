"""vLLM's request options and bodies, each served as vLLM serves it or refused by name: checked
against the stage code (`oracle`) on the same inputs cut or scored as vLLM would."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from prensa.stages import contract
from tests.fast.conftest import MAX_LENGTH

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "in", "the", "city"]
TEXT = " ".join(WORDS)
QUERY = "capital of france"
PASSAGES = ["paris is the capital of france .", "the lazy dog .", "berlin is a city in germany ."]
ATOL = 1e-5


def first_words(count: int) -> str:
    """What a window of `count + 2` tokens keeps of TEXT (one token per word, [CLS] and [SEP] around)."""
    return " ".join(WORDS[:count])


def refused_as_vllm(response, named: str) -> bool:
    """vLLM's answer to a bad request: 400 and OpenAI's error object (the OpenAI SDK's BadRequestError)."""
    body = response.json()
    return (response.status_code == 400 and body["error"]["type"] == "BadRequestError"
            and body["error"]["code"] == 400 and named in body["error"]["message"])


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_truncate_prompt_tokens_keeps_the_first_tokens(http, oracle):
    for window in (3, 6, 10):
        answer = http.post("/v1/embeddings", json={"input": [TEXT], "model": "embed",
                                                   "truncate_prompt_tokens": window}).json()
        assert answer["usage"]["prompt_tokens"] == window
        want = oracle("embed")([first_words(window - 2)])[contract.DENSE]
        np.testing.assert_allclose([answer["data"][0]["embedding"]], want, atol=ATOL)
    whole = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", "truncate_prompt_tokens": -1}).json()
    np.testing.assert_allclose([whole["data"][0]["embedding"]], oracle("embed")([TEXT])[contract.DENSE], atol=ATOL)
    ids = oracle("embed").tokens([TEXT])[contract.INPUT_IDS][0].tolist()
    by_ids = http.post("/v1/embeddings", json={"input": [ids], "model": "embed", "truncate_prompt_tokens": 5}).json()
    assert by_ids["usage"]["prompt_tokens"] == 5
    for body, named in (({"truncate_prompt_tokens": MAX_LENGTH + 1}, "greater than"),
                        ({"truncate_prompt_tokens": 0}, "at least 3"), ({"truncate_prompt_tokens": -5}, "-1"),
                        ({"truncate_prompt_tokens": 8, "truncate": "END"}, "`truncate` is a field of OpenAI's"),
                        ({"truncate_prompt_tokens": 8, "chunking": {"enabled": True}}, "not both")):
        refused = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", **body})
        assert refused_as_vllm(refused, named), (body, refused.text)


def test_truncation_side_left_keeps_the_last_tokens(http, oracle):
    left = http.post("/v1/embeddings", json={"input": [TEXT], "model": "embed", "truncate_prompt_tokens": 5,
                                             "truncation_side": "left"}).json()
    np.testing.assert_allclose([left["data"][0]["embedding"]],
                               oracle("embed")([" ".join(WORDS[-3:])])[contract.DENSE], atol=ATOL)
    ranked = http.post("/rerank", json={"model": "rerank", "query": QUERY, "texts": [TEXT], "raw_scores": True,
                                        "truncate_prompt_tokens": 9, "truncation_side": "left"}).json()
    kept = oracle("rerank").tokens([QUERY], [" ".join(WORDS[-3:])])  # [CLS] 3 [SEP] 3 [SEP]: the text's last 3
    logits = oracle("rerank").encoded(kept)[contract.LOGITS][:, 0]
    np.testing.assert_allclose([r["score"] for r in ranked], logits, atol=ATOL)
    nim = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", "truncate": "END",
                                            "truncation_side": "left"})
    tei = http.post("/rerank", json={"model": "rerank", "query": QUERY, "texts": [TEXT],
                                     "truncation_direction": "right", "truncation_side": "left"})
    # `truncation_side` makes the body vLLM's, where NIM's `truncate` is no field: refused by name
    assert refused_as_vllm(nim, "`truncate` is a field of OpenAI's"), nim.text
    assert tei.status_code == 422 and "disagree" in tei.text, tei.text  # TEI's body: TEI's answer


def test_classify_and_pooling_take_a_window_too(http, oracle):
    got = http.post("/classify", json={"input": TEXT, "model": "classify", "truncate_prompt_tokens": 4}).json()
    want = oracle("classify")([first_words(2)])[contract.SCORES][0]
    assert got["data"][0]["probs"] == pytest.approx(want.tolist(), abs=ATOL) and got["usage"]["prompt_tokens"] == 4
    pooled = http.post("/pooling", json={"input": TEXT, "model": "embed", "truncate_prompt_tokens": 7}).json()
    np.testing.assert_allclose([pooled["data"][0]["data"]], oracle("embed")([first_words(5)])[contract.DENSE],
                               atol=ATOL)


def test_normalize_false_answers_the_raw_pooled_vector(http, oracle):
    want = oracle("embed")
    tokens = want.tokens([TEXT])
    hidden, mask = want.encoded(tokens)[contract.LAST_HIDDEN_STATE], tokens[contract.ATTENTION_MASK]
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    raw = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", "normalize": False}).json()
    np.testing.assert_allclose([raw["data"][0]["embedding"]], mean, atol=ATOL)
    assert abs(np.linalg.norm(mean) - 1) > 1e-3, "the test model's mean vector must not be unit length already"
    unit = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", "normalize": True}).json()
    np.testing.assert_allclose([unit["data"][0]["embedding"]], want([TEXT])[contract.DENSE], atol=ATOL)


@pytest.mark.parametrize(("dtype", "numpy_type", "atol"), [("float32", "f4", 1e-6), ("float16", "f2", 1e-3)])
@pytest.mark.parametrize("endianness", ["little", "big"])
def test_embed_dtype_writes_base64_in_that_type(http, oracle, dtype, numpy_type, atol, endianness):
    answer = http.post("/v1/embeddings", json={"input": TEXT, "model": "embed", "encoding_format": "base64",
                                               "embed_dtype": dtype, "endianness": endianness}).json()
    order = "<" if endianness == "little" else ">"
    got = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype=order + numpy_type)
    np.testing.assert_allclose(got, oracle("embed")([TEXT])[contract.DENSE][0], atol=atol)


def test_embed_dtype_refuses_what_it_does_not_know(http):
    unknown = http.post("/v1/embeddings", json={"input": TEXT, "encoding_format": "base64", "embed_dtype": "int4"})
    assert refused_as_vllm(unknown, "embed_dtype"), unknown.text
    bfloat = http.post("/v1/embeddings", json={"input": TEXT, "encoding_format": "base64", "embed_dtype": "bfloat16"})
    assert len(base64.b64decode(bfloat.json()["data"][0]["embedding"])) == 2 * len(
        http.post("/v1/embeddings", json={"input": TEXT}).json()["data"][0]["embedding"])


def test_use_activation_false_answers_logits(http, oracle):
    logits = oracle("rerank")([QUERY] * 3, PASSAGES)[contract.LOGITS][:, 0]
    for field in ("use_activation", "activation"):
        score = http.post("/score", json={"model": "rerank", "text_1": QUERY, "text_2": PASSAGES, field: False}).json()
        np.testing.assert_allclose([d["score"] for d in score["data"]], logits, atol=ATOL)
        ranked = http.post("/rerank", json={"model": "rerank", "query": QUERY, "texts": PASSAGES, field: False}).json()
        np.testing.assert_allclose(sorted(r["score"] for r in ranked), sorted(logits), atol=ATOL)
    on = http.post("/score", json={"model": "rerank", "text_1": QUERY, "text_2": PASSAGES, "use_activation": True})
    np.testing.assert_allclose([d["score"] for d in on.json()["data"]], sigmoid(logits), atol=ATOL)
    cohere = http.post("/v1/rerank", json={"model": "rerank", "query": QUERY, "documents": PASSAGES,
                                           "use_activation": False}).json()
    np.testing.assert_allclose(sorted(r["relevance_score"] for r in cohere["results"]), sorted(logits), atol=ATOL)
    refused = http.post("/rerank", json={"model": "rerank", "query": QUERY, "texts": PASSAGES, "raw_scores": True,
                                         "use_activation": True})
    assert refused.status_code == 422, refused.text
    # a cosine similarity has no activation: vLLM serves it unchanged
    cosine = {"model": "embed", "text_1": QUERY, "text_2": PASSAGES}
    plain = http.post("/score", json=cosine).json()["data"]
    unactivated = http.post("/score", json={**cosine, "use_activation": False})
    assert unactivated.status_code == 200, unactivated.text
    assert [d["score"] for d in unactivated.json()["data"]] == [d["score"] for d in plain]


def test_max_tokens_per_doc_cuts_each_document_first(http, oracle):
    cut = [" ".join(p.split()[:2]) for p in PASSAGES]
    want = oracle("rerank")([QUERY] * 3, cut)[contract.SCORES][:, 0]
    tei = http.post("/rerank", json={"model": "rerank", "query": QUERY, "texts": PASSAGES, "max_tokens_per_doc": 2})
    np.testing.assert_allclose([r["score"] for r in sorted(tei.json(), key=lambda r: r["index"])], want, atol=ATOL)
    cohere = http.post("/v1/rerank", json={"model": "rerank", "query": QUERY, "documents": PASSAGES,
                                           "max_tokens_per_doc": 2}).json()
    np.testing.assert_allclose([r["relevance_score"] for r in sorted(cohere["results"], key=lambda r: r["index"])],
                               want, atol=ATOL)
    for path, field, status in (("/rerank", "texts", 422), ("/v1/rerank", "documents", 400)):  # TEI's, Cohere's
        for wrong in (0, -5):
            refused = http.post(path, json={"model": "rerank", "query": QUERY, field: PASSAGES,
                                            "max_tokens_per_doc": wrong})
            assert refused.status_code == status and "max_tokens_per_doc" in refused.text
    vllm = http.post("/rerank", json={"model": "rerank", "query": QUERY, "documents": PASSAGES, "max_tokens_per_doc": 0})
    assert refused_as_vllm(vllm, "max_tokens_per_doc"), vllm.text


def test_score_takes_every_name_vllm_gives_its_pairs(http, oracle):
    want = oracle("rerank")([QUERY] * 3, PASSAGES)[contract.SCORES][:, 0]
    for first, second in (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                          ("data_1", "data_2")):
        answer = http.post("/score", json={"model": "rerank", first: QUERY, second: PASSAGES})
        assert answer.status_code == 200, (first, second, answer.text)
        np.testing.assert_allclose([d["score"] for d in answer.json()["data"]], want, atol=ATOL)
    both = http.post("/score", json={"model": "rerank", "text_1": QUERY, "data_1": QUERY, "text_2": PASSAGES})
    assert refused_as_vllm(both, "`text_1` and `data_1`"), both.text


def test_rerank_documents_come_as_vllm_and_infinity_read_them(http, start_gateway):
    """vLLM's objects, `return_documents: true` too (LiteLLM's `hosted_vllm/` sends it); Infinity's
    strings for a body with its own `raw_scores` and `return_documents` (none without it, as Infinity),
    or from a gateway told to (`--rerank-document-strings`)."""
    body = {"model": "rerank", "query": QUERY, "documents": PASSAGES}
    for asked in ({}, {"return_documents": True}):
        vllm = http.post("/rerank", json={**body, **asked}).json()
        assert [r["document"] for r in vllm["results"]] == [{"text": PASSAGES[r["index"]]} for r in vllm["results"]]
    assert vllm["usage"]["total_tokens"] > 0 and vllm["id"].startswith("rerank-")
    infinity = http.post("/rerank", json={**body, "return_documents": True, "raw_scores": False}).json()
    assert [r["document"] for r in infinity["results"]] == [PASSAGES[r["index"]] for r in infinity["results"]]
    unechoed = http.post("/rerank", json={**body, "raw_scores": True}).json()
    assert [r["document"] for r in unechoed["results"]] == [None] * len(PASSAGES)
    assert [r["relevance_score"] for r in unechoed["results"]] != [r["relevance_score"] for r in infinity["results"]]
    told = start_gateway(rerank_document_strings=True).post("/rerank", json={**body, "return_documents": True}).json()
    assert [r["document"] for r in told["results"]] == [PASSAGES[r["index"]] for r in told["results"]]


def test_invocations_routes_vllms_bodies_by_their_fields(http):
    pairs = {"model": "rerank", "text_1": QUERY, "text_2": PASSAGES}
    scored = http.post("/invocations", json=pairs).json()
    assert scored["data"] == http.post("/score", json=pairs).json()["data"] and scored["id"].startswith("score-")
    embedding = http.post("/invocations", json={"model": "embed", "input": [TEXT]}).json()
    assert embedding["object"] == "list" and embedding["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(embedding["data"][0]["embedding"],
                               http.post("/v1/embeddings", json={"model": "embed", "input": [TEXT]}).json()
                               ["data"][0]["embedding"], atol=ATOL)
    classified = http.post("/invocations", json={"model": "classify", "input": [TEXT]}).json()
    assert classified["data"][0]["num_classes"] == 3
    ranked = http.post("/invocations", json={"model": "rerank", "query": QUERY, "documents": PASSAGES}).json()
    assert ranked["object"] == "rerank" and len(ranked["results"]) == 3
    tei = http.post("/invocations", json={"model": "embed", "inputs": TEXT})
    assert np.asarray(tei.json()).shape[0] == 1


def test_tokenize_answers_vllms_body_in_its_shape(http, oracle):
    ids = oracle("embed").tokens([TEXT])[contract.INPUT_IDS][0].tolist()
    answer = http.post("/tokenize", json={"model": "embed", "prompt": TEXT}).json()
    assert answer == {"count": len(ids), "max_model_len": MAX_LENGTH, "tokens": ids, "token_strs": None}
    strings = http.post("/tokenize", json={"model": "embed", "prompt": TEXT, "add_special_tokens": False,
                                           "return_token_strs": True}).json()
    assert strings["tokens"] == ids[1:-1] and strings["token_strs"] == WORDS
    for wrong, status in (({"prompt": TEXT, "inputs": TEXT}, 400), ({"inputs": TEXT, "return_token_strs": True}, 422),
                          ({}, 422)):  # vLLM's body (`prompt`) gets vLLM's status, TEI's TEI's
        assert http.post("/tokenize", json={"model": "embed", **wrong}).status_code == status, wrong


def test_infinitys_model_list_and_health(http):
    listed = http.get("/models").json()
    assert listed == http.get("/v1/models").json()
    cards = {card["id"]: card for card in listed["data"]}
    assert cards["rerank"]["capabilities"] == ["rerank", "classify"] and cards["embed"]["capabilities"] == ["embed"]
    assert cards["embed"]["stats"]["batch_size"] == 64 and cards["embed"]["backend"] == "triton"
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["unix"] > 1.7e9


def test_late_chunking_pools_each_chunk_over_its_span_of_one_pass(http, oracle):
    """Jina's late chunking: the chunks read as one sequence, each the mean of its own tokens' states."""
    chunks = ["the quick brown fox", "jumps over the lazy dog", "in the city"]
    want = oracle("embed")
    tokens = want.tokens([" ".join(chunks)])  # one word, one token: the chunks' tokens, joined
    states = want.encoded(tokens)[contract.LAST_HIDDEN_STATE][0]
    spans, start = [], 1  # after [CLS]
    for chunk in chunks:
        spans.append(states[start : start + len(chunk.split())].mean(axis=0))
        start += len(chunk.split())
    expected = np.stack(spans) / np.linalg.norm(np.stack(spans), axis=1, keepdims=True)
    answer = http.post("/v1/embeddings", json={"input": chunks, "model": "embed", "late_chunking": True}).json()
    np.testing.assert_allclose([d["embedding"] for d in answer["data"]], expected, atol=ATOL)
    assert answer["usage"]["prompt_tokens"] == int(tokens[contract.ATTENTION_MASK].sum())
    alone = http.post("/v1/embeddings", json={"input": chunks, "model": "embed"}).json()
    assert np.abs(np.asarray([d["embedding"] for d in alone["data"]]) - expected).max() > 1e-3
    long = " ".join(["river"] * MAX_LENGTH)
    for body, named in (({"input": [long, "dog"]}, "one pass"), ({"input": chunks, "chunking": {"enabled": True}}, "drop"),
                        ({"input": chunks, "model": "splade"}, "dense embeddings"),
                        ({"input": [[5, 6, 7]]}, "plain texts"), ({"input": ["dog", "   "]}, "no tokens")):
        refused = http.post("/v1/embeddings", json={"model": "embed", **body, "late_chunking": True})
        assert refused.status_code == 422 and named in refused.text, (body, refused.text)


def test_late_chunking_refuses_models_that_pool_otherwise(http):
    from dataclasses import replace

    from prensa.gateway.core.asks import late_chunking_refusal

    embed = http.app.state.gateway.registry.models["embed"]
    assert late_chunking_refusal(embed) is None
    assert "last token" in late_chunking_refusal(replace(embed, pooling="last"))
    projected = replace(embed, encode_outputs=(*embed.encode_outputs, contract.SENTENCE_EMBEDDING))
    assert "Dense" in late_chunking_refusal(projected)
    assert "not a dense embedder" in late_chunking_refusal(http.app.state.gateway.registry.models["rerank"])
