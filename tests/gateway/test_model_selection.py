"""A multi-model server answers with the model a request names, on every route, by `?model=` or
the body's `model`: two served models of each task, each compared with a direct Triton call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.triton

TEXT = "Berlin is the capital and largest city of Germany."
QUERY = "What is the capital of Germany?"
PASSAGES = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "A quick brown fox."]


def dense_of(direct, model: str) -> np.ndarray:
    return direct(model, [TEXT])["dense"][0]


def rerank_of(direct, model: str) -> np.ndarray:
    return direct(model, [QUERY] * len(PASSAGES), PASSAGES)["scores"][:, 0]


def by_index(results: list[dict], key: str) -> list[float]:
    return [r[key] for r in sorted(results, key=lambda r: r["index"])]


# path -> (body for a model name, the answer's numbers, the reference from direct Triton calls)
DENSE: dict[str, tuple[Callable[[str], dict], Callable[[Any], Any], Callable[..., Any]]] = {
    "/embed": (lambda m: {"inputs": TEXT, "model": m}, lambda a: a[0], dense_of),
    "/v1/embeddings": (lambda m: {"input": TEXT, "model": m}, lambda a: a["data"][0]["embedding"], dense_of),
    "/v1/embed": (lambda m: {"texts": [TEXT], "model": m}, lambda a: a["embeddings"][0], dense_of),
    "/v2/embed": (lambda m: {"texts": [TEXT], "model": m}, lambda a: a["embeddings"]["float"][0], dense_of),
    "/": (lambda m: {"inputs": TEXT, "model": m}, lambda a: a[0], dense_of),
    "/vertex": (lambda m: {"instances": [{"inputs": TEXT, "model": m}]}, lambda a: a["predictions"][0][0], dense_of),
    "/similarity": (lambda m: {"inputs": {"source_sentence": TEXT, "sentences": PASSAGES}, "model": m},
                    lambda a: a, lambda direct, m: similarity(direct, m)),
}
RERANK = {
    "/rerank": (lambda m: {"query": QUERY, "texts": PASSAGES, "model": m}, lambda a: by_index(a, "score")),
    "/v1/rerank": (lambda m: {"query": QUERY, "documents": PASSAGES, "model": m},
                   lambda a: by_index(a["results"], "relevance_score")),
    "/v2/rerank": (lambda m: {"query": QUERY, "documents": PASSAGES, "model": m},
                   lambda a: by_index(a["results"], "relevance_score")),
    "/v1/ranking": (lambda m: {"query": {"text": QUERY}, "passages": [{"text": p} for p in PASSAGES], "model": m},
                    lambda a: 1 / (1 + np.exp(-np.asarray(by_index(a["rankings"], "logit"))))),
    "/predict": (lambda m: {"inputs": [[QUERY, p] for p in PASSAGES], "model": m}, lambda a: [r[0]["score"] for r in a]),
    "/": (lambda m: {"query": QUERY, "texts": PASSAGES, "model": m}, lambda a: by_index(a, "score")),
}


def similarity(direct, model: str) -> np.ndarray:
    vectors = direct(model, [TEXT, *PASSAGES])["dense"]
    return vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))


@pytest.mark.parametrize("path", sorted(DENSE))
@pytest.mark.parametrize("where", ["body", "query"])
def test_dense_routes_answer_with_the_named_model(http, direct, path, where):
    body_of, numbers, reference = DENSE[path]
    for model in ("minilm", "bge-m3"):
        body = body_of(model)
        url = path
        if where == "query":
            (body["instances"][0] if path == "/vertex" else body).pop("model")
            url = f"{path}?model={model}"
        response = http.post(url, json=body)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(numbers(response.json()), reference(direct, model), atol=1e-5)


@pytest.mark.parametrize("path", sorted(RERANK))
def test_rerank_routes_answer_with_the_named_model(http, direct, path):
    body_of, numbers = RERANK[path]
    answers = {}
    for model in ("reranker", "msmarco"):
        response = http.post(path, json=body_of(model))
        assert response.status_code == 200, response.text
        answers[model] = numbers(response.json())
        np.testing.assert_allclose(answers[model], rerank_of(direct, model), atol=1e-5)
    assert not np.allclose(answers["reranker"], answers["msmarco"], atol=1e-3)  # two models, two answers


def test_sparse_routes_answer_with_the_named_model(http, direct):
    for path, body_of in (("/embed_sparse", lambda m: {"inputs": TEXT, "model": m}),
                          ("/", lambda m: {"inputs": TEXT, "model": m})):
        for model in ("bge-m3", "splade"):
            if path == "/" and model == "bge-m3":
                continue  # bge-m3's default route is dense
            terms = http.post(path, json=body_of(model)).json()[0]
            ids = direct(model, [TEXT])["sparse_ids"][0]
            assert [t["index"] for t in terms] == ids[ids >= 0].tolist()


def test_token_routes_answer_with_the_named_model(http, tokenizer, direct):
    for model in ("minilm", "bge-m3"):
        tokens = http.post("/tokenize", json={"inputs": TEXT, "model": model}).json()[0]
        assert [t["id"] for t in tokens] == tokenizer(model).encode(TEXT).ids
        ids = tokenizer(model).encode(TEXT).ids
        assert http.post("/decode", json={"ids": ids, "model": model}).json() == [tokenizer(model).decode(ids)]
        hidden = http.post("/embed_all", json={"inputs": TEXT, "model": model}).json()[0]
        assert len(hidden) == len(ids)
    colbert = http.post("/embed_colbert", json={"inputs": TEXT, "model": "bge-m3"}).json()[0]
    np.testing.assert_allclose(colbert, direct("bge-m3", [TEXT])["colbert"][0, : len(colbert)], atol=1e-5)


def test_conflicting_and_unknown_names(http):
    conflict = http.post("/embed?model=minilm", json={"inputs": TEXT, "model": "bge-m3"})
    assert conflict.status_code == 422 and "different models" in conflict.json()["error"]
    same = http.post("/embed?model=minilm", json={"inputs": TEXT, "model": "minilm"})
    assert same.status_code == 200
    for path, body in (("/embed", {"inputs": TEXT}), ("/v1/embeddings", {"input": TEXT}),
                       ("/v2/rerank", {"query": QUERY, "documents": PASSAGES}), ("/", {"inputs": TEXT})):
        unknown = http.post(path, json={**body, "model": "no-such-model"})
        assert unknown.status_code == 404, path
        message = unknown.json().get("error") or unknown.json()["message"]
        assert "no-such-model" in message and "minilm" in message and "reranker" in message
    wrong_task = http.post("/v2/rerank", json={"query": QUERY, "documents": PASSAGES, "model": "minilm"})
    assert wrong_task.status_code == 400  # Cohere's status for a request it cannot serve (TEI's 422)


def test_models_list_and_retrieve(http, exports):
    listed = http.get("/v1/models").json()
    assert listed["object"] == "list"
    ids = {card["id"] for card in listed["data"]}
    assert set(exports) <= ids
    card = http.get("/v1/models/bge-m3").json()
    assert (card["id"], card["object"], card["owned_by"], card["task"]) == ("bge-m3", "model", "prensa", "m3")
    missing = http.get("/v1/models/no-such-model")
    assert missing.status_code == 404 and "no-such-model" in missing.json()["message"]
