"""Fused models through the gateway give what their ensembles give, on every path: texts, token
ids, left truncation, pooling in the gateway, per-token outputs, sparse, ColBERT and rerank. (The
ensembles are checked against FlagEmbedding, sentence-transformers and onnxruntime elsewhere.)"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.triton

TEXTS = ["What is the capital of Germany?", "ok", "Berlin is the capital and largest city of Germany. " * 40]


def both(http, route: str, model: str, body: dict) -> tuple[object, object]:
    """The same request to the ensemble `model` and to `model-fused`; both must succeed."""
    answers = [http.post(f"{route}?model={name}", json=body) for name in (model, f"{model}-fused")]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    return answers[0].json(), answers[1].json()


@pytest.mark.parametrize("body", [
    {"inputs": TEXTS},
    {"inputs": TEXTS, "truncation_direction": "left"},  # the gateway tokenizes; token ids go to Triton
    {"inputs": TEXTS, "normalize": False},  # encoder output, pooled by the gateway
    {"inputs": [[101, 2054, 2003, 1996, 3007, 1997, 2762, 1029, 102], "ok"]},
])
def test_fused_embed_matches_the_ensemble(http, body):
    ensemble, fused = both(http, "/embed", "minilm", body)
    np.testing.assert_allclose(fused, ensemble, atol=1e-5)


def test_fused_per_token_outputs_match_the_ensemble(http):
    ensemble, fused = both(http, "/embed_all", "minilm", {"inputs": TEXTS[:2]})
    for expected, got in zip(ensemble, fused):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    ensemble, fused = both(http, "/embed_colbert", "bge-m3", {"inputs": TEXTS})
    for expected, got in zip(ensemble, fused):
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_fused_sparse_and_rerank_match_the_ensemble(http):
    ensemble, fused = both(http, "/embed_sparse", "bge-m3", {"inputs": TEXTS})
    assert [[t["index"] for t in row] for row in fused] == [[t["index"] for t in row] for row in ensemble]
    np.testing.assert_allclose([t["value"] for row in fused for t in row],
                               [t["value"] for row in ensemble for t in row], atol=1e-5)
    body = {"query": TEXTS[0], "texts": TEXTS, "raw_scores": True}
    ensemble, fused = both(http, "/rerank", "msmarco", body)
    assert [r["index"] for r in fused] == [r["index"] for r in ensemble]
    np.testing.assert_allclose([r["score"] for r in fused], [r["score"] for r in ensemble], atol=1e-4)


def test_fused_model_errors_stay_with_their_request(http, direct):
    bad = http.post("/embed?model=minilm-fused", json={"inputs": [[101, 10**6, 102]]})
    assert bad.status_code == 422
    good = http.post("/embed?model=minilm-fused", json={"inputs": "ok"})
    np.testing.assert_allclose(good.json()[0], direct("minilm", ["ok"])["dense"][0], atol=1e-5)
