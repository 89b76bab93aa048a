"""How closely a reduced-precision graph (fp16 ONNX, a TensorRT engine) follows the fp32 one.

The figure is cosine similarity over the vectors clients actually consume: each real token's
vector for per-token outputs (padding is free to differ), each row for pooled outputs, and the
whole batch at once where a row is a single number (one-logit rerankers), where a per-row cosine
could only say +1 or -1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

MIN_COSINE = 0.999
# What prensa serves in fp32 against the model's own library (sentence-transformers' encode, an
# LLM reranker card's formula) on the same weights.
REFERENCE_MAX_DIFF = 1e-4  # largest |served - reference| on any component
REFERENCE_MIN_COSINE = 0.99999  # least cosine between a served vector and the reference's


def output_vectors(
    value: npt.NDArray[Any], mask: npt.NDArray[Any], per_token: bool
) -> npt.NDArray[Any]:
    """[vectors, features] in float64: what one cosine each is computed over."""
    if per_token:
        value = value[mask.astype(bool)]
    rows = value.reshape(value.shape[0], -1).astype(np.float64)
    return rows.reshape(1, -1) if rows.shape[1] == 1 else rows


def min_cosine(actual: npt.NDArray[Any], expected: npt.NDArray[Any], eps: float = 1e-12) -> float:
    """Smallest row-wise cosine; two all-zero rows agree, one all-zero row does not."""
    dot = (actual * expected).sum(axis=1)
    norms = np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1)
    both_zero = (np.linalg.norm(actual, axis=1) < eps) & (np.linalg.norm(expected, axis=1) < eps)
    cosine = np.where(both_zero, 1.0, dot / np.maximum(norms, eps))
    return float(cosine.min()) if cosine.size else 1.0


def agreement(
    actual: dict[str, npt.NDArray[Any]],
    expected: dict[str, npt.NDArray[Any]],
    mask: npt.NDArray[Any],
    per_token: set[str],
) -> dict[str, tuple[float, float]]:
    """Per output: (min cosine, max |difference|) of `actual` against the fp32 `expected`."""
    figures = {}
    for name, want in expected.items():
        got = output_vectors(actual[name], mask, name in per_token)
        ref = output_vectors(want, mask, name in per_token)
        figures[name] = (min_cosine(got, ref), float(np.abs(got - ref).max()) if ref.size else 0.0)
    return figures


def reference_agreement(
    served: npt.NDArray[Any], expected: npt.NDArray[Any]
) -> tuple[float, float]:
    """(max |served - expected|, least row cosine) over every row; one score a row is one vector
    (a row's cosine could only say +1 or -1). Different shapes (a dimension lost) agree nowhere."""
    if served.shape != expected.shape:
        return float("inf"), -1.0
    diff = float(np.abs(served - expected).max()) if expected.size else 0.0
    if expected.ndim == 2 and expected.shape[1] == 1:
        served, expected = served.reshape(1, -1), expected.reshape(1, -1)
    left, right = np.linalg.norm(served, axis=1), np.linalg.norm(expected, axis=1)
    both_zero = (left == 0) & (right == 0)
    cosine = np.where(
        both_zero, 1.0, (served * expected).sum(axis=1) / np.maximum(left * right, 1e-12)
    )
    return diff, float(cosine.min()) if cosine.size else 1.0
