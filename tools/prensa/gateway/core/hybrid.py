"""bge-m3's three relevance scores from its three outputs, and their weighted sums, as
FlagEmbedding's `BGEM3FlagModel.compute_score` defines them: dense is the dot product of the
L2-normalised vectors, sparse the lexical match (the sum, over the vocabulary ids both texts
share, of the product of their weights), ColBERT the mean over the query's token vectors of
the best dot product with any of the passage's. The weights are FlagEmbedding's
`weights_for_different_modes`, in the order dense, sparse, ColBERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# FlagEmbedding's suggested weights (its README's hybrid example): dense, sparse, ColBERT.
DEFAULT_WEIGHTS = (0.4, 0.2, 0.4)
MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")
HYBRID = "colbert+sparse+dense"  # what a bge-m3 model answers on the rerank routes


@dataclass(frozen=True)
class M3Rows:
    """bge-m3's outputs for some texts, one entry per text: what `Service.m3` returns."""

    dense: npt.NDArray[Any] | None  # [n, dim], L2-normalised
    # ascending vocabulary ids of each text's non-zero weights
    sparse_ids: list[npt.NDArray[Any]] | None
    sparse_weights: list[npt.NDArray[Any]] | None
    colbert: list[npt.NDArray[Any]] | None  # [tokens - 1, dim] each, L2-normalised
    num_tokens: npt.NDArray[Any]  # [n], special tokens included
    chunks: list[int] | None = None  # windows per text, when long texts were chunked


def lexical_match(
    ids_a: npt.NDArray[Any],
    weights_a: npt.NDArray[Any],
    ids_b: npt.NDArray[Any],
    weights_b: npt.NDArray[Any],
) -> float:
    _, in_a, in_b = np.intersect1d(ids_a, ids_b, assume_unique=True, return_indices=True)
    return float(np.dot(weights_a[in_a].astype(np.float64), weights_b[in_b].astype(np.float64)))


def max_sim(query: npt.NDArray[Any], passage: npt.NDArray[Any]) -> float:
    """bge-m3's ColBERT score: the mean over query tokens of their best dot product with a passage
    token (FlagEmbedding's `colbert_score`)."""
    if not len(query) or not len(passage):
        return 0.0
    return float((query @ passage.T).max(axis=1).mean())


def late_score(query: npt.NDArray[Any], document: npt.NDArray[Any]) -> float:
    """A late-interaction model's score: the sum over query tokens of their best dot product with a
    document token (PyLate's `colbert_scores`, ColBERT's MaxSim)."""
    if not len(query) or not len(document):
        return 0.0
    return float((query @ document.T).max(axis=1).sum())


def check_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    """Three non-negative weights (dense, sparse, ColBERT) whose sums the mixed modes divide by."""
    if (
        len(weights) != 3
        or any(w < 0 for w in weights)
        or weights[0] + weights[1] <= 0
        or sum(weights) <= 0
    ):
        raise ValueError(
            "`weights` takes three non-negative numbers (dense, sparse, ColBERT) with a positive "
            "dense + sparse"
        )
    return float(weights[0]), float(weights[1]), float(weights[2])


def scores(rows: M3Rows, weights: Sequence[float] = DEFAULT_WEIGHTS) -> dict[str, list[float]]:
    """Every mode's score of rows 1.. (the passages) against row 0 (the query)."""
    assert (
        rows.dense is not None
        and rows.sparse_ids is not None
        and rows.sparse_weights is not None
        and rows.colbert is not None
    ), "hybrid scores need all three outputs"
    w_dense, w_sparse, w_colbert = check_weights(weights)
    passages = range(1, len(rows.num_tokens))
    dense = (rows.dense[1:].astype(np.float64) @ rows.dense[0].astype(np.float64)).tolist()
    sparse = [
        lexical_match(
            rows.sparse_ids[0], rows.sparse_weights[0], rows.sparse_ids[i], rows.sparse_weights[i]
        )
        for i in passages
    ]
    colbert = [max_sim(rows.colbert[0], rows.colbert[i]) for i in passages]
    return {
        "dense": dense,
        "sparse": sparse,
        "colbert": colbert,
        "sparse+dense": [
            (w_sparse * s + w_dense * d) / (w_sparse + w_dense) for d, s in zip(dense, sparse)
        ],
        HYBRID: [
            (w_dense * d + w_sparse * s + w_colbert * c) / (w_dense + w_sparse + w_colbert)
            for d, s, c in zip(dense, sparse, colbert)
        ],
    }
