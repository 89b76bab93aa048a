"""What several dialects' answers are built from (no HTTP, no pydantic): labels and documents
ranked by score, the id and time every vLLM-style answer opens with, and their token counts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from prensa.gateway.core.registry import ServedModel


def text_list(inputs: str | list[str]) -> list[str]:
    """vLLM's and Infinity's `input`: a text, or a list of texts."""
    return [inputs] if isinstance(inputs, str) else list(inputs)


def ranked_labels(
    values: npt.NDArray[Any], labels: Sequence[str], top_k: int | None = None
) -> list[list[dict[str, Any]]]:
    """Per row, `{score, label}` of its `top_k` (default all) labels, best first, ties in label order."""
    return [
        [
            {"score": row[j], "label": labels[j]}
            for j in np.argsort(-np.asarray(row), kind="stable").tolist()[:top_k]
        ]
        for row in values.tolist()
    ]


def ranking(scores: npt.NDArray[Any], top_n: int | None) -> list[int]:
    """Indexes of the `top_n` (default all) best scores, best first, ties in input order."""
    order: list[int] = np.argsort(-scores, kind="stable").tolist()
    return order[:top_n]


def opening(kind: str, served: ServedModel) -> dict[str, Any]:
    """The fields a vLLM or Infinity answer opens with: a fresh id, the time, the model."""
    return {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.name}


def usage(tokens: int, completion: bool = False) -> dict[str, int]:
    """Token counts as OpenAI, vLLM (`completion`: with its zero completion tokens) and Infinity
    report them."""
    counts = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {**counts, "completion_tokens": 0} if completion else counts
