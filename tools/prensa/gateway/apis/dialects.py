"""Which vendor's API a request speaks, where several vendors share a path: one table from such a
path to the rule that tells their bodies apart by the fields the body sets, and the error shape
each dialect answers in. `shared` reads a body as its dialect's own (and `POST /` picks an
operation) by `dialect_of`, the error handlers answer a failure in `error_shape`; nothing else
tells dialects apart."""

from __future__ import annotations

from collections.abc import Callable, Collection
from enum import StrEnum

from pydantic import BaseModel

from prensa.gateway.apis.common import VllmActivation, VllmEncoding, VllmPriority, VllmTruncation
from prensa.gateway.errors import ErrorShape


class Dialect(StrEnum):
    TEI = "tei"
    OPENAI = "openai"  # TEI's OpenAI-compatible route: OpenAI's, NIM's, Jina's and PyLate's bodies
    VLLM = "vllm"
    INFINITY = "infinity"
    BGE_M3 = "bge-m3"  # prensa's own bge-m3 bodies (`/score`'s hybrid)


# How messages name each dialect
DIALECT_NAMES: dict[Dialect, str] = {
    Dialect.TEI: "TEI",
    Dialect.OPENAI: "OpenAI",
    Dialect.VLLM: "vLLM",
    Dialect.INFINITY: "Infinity",
    Dialect.BGE_M3: "prensa's bge-m3",
}

# How each dialect answers errors: vLLM with OpenAI's error object and 400 for a bad request,
# OpenAI's compatible route as TEI's does, the others as TEI.
ERROR_SHAPES: dict[Dialect, ErrorShape] = {
    Dialect.TEI: ErrorShape.TEI,
    Dialect.OPENAI: ErrorShape.OPENAI,
    Dialect.VLLM: ErrorShape.VLLM,
    Dialect.INFINITY: ErrorShape.TEI,
    Dialect.BGE_M3: ErrorShape.TEI,
}

# vLLM's names for the two sides of `/score`'s pairs
VLLM_FIRST_TEXTS = ("text_1", "queries", "data_1")
VLLM_SECOND_TEXTS = ("text_2", "documents", "items", "data_2")
VLLM_PAIR_FIELDS = frozenset((*VLLM_FIRST_TEXTS, *VLLM_SECOND_TEXTS))
# options only vLLM's bodies carry
VLLM_OPTIONS = frozenset(
    {
        *VllmTruncation.model_fields,
        *VllmEncoding.model_fields,
        *VllmActivation.model_fields,
        *VllmPriority.model_fields,
    }
)

Fields = Collection[str]


def _rerank(fields: Fields) -> Dialect:
    """TEI's body has `texts`; vLLM's and Infinity's the same `documents`, Infinity's own `raw_scores`."""
    if "documents" not in fields:
        return Dialect.TEI
    return Dialect.INFINITY if "raw_scores" in fields else Dialect.VLLM


def _classify(fields: Fields) -> Dialect:
    """vLLM's and Infinity's bodies are the same but for Infinity's `raw_scores`."""
    return Dialect.INFINITY if "raw_scores" in fields else Dialect.VLLM


def _score(fields: Fields) -> Dialect:
    return Dialect.VLLM if VLLM_PAIR_FIELDS.intersection(fields) else Dialect.BGE_M3


def _tokenize(fields: Fields) -> Dialect:
    return Dialect.VLLM if "prompt" in fields else Dialect.TEI


def _embeddings(fields: Fields) -> Dialect:
    return Dialect.VLLM if VLLM_OPTIONS.intersection(fields) else Dialect.OPENAI


def _sagemaker(fields: Fields) -> Dialect:
    """`/invocations` and `/`: vLLM's pair and `input` bodies as vLLM's `/invocations` reads them."""
    vllm = VLLM_PAIR_FIELDS.intersection(fields) or ("input" in fields and "inputs" not in fields)
    return Dialect.VLLM if vllm else Dialect.TEI


INVOCATIONS_PATH = "/invocations"  # SageMaker's, where vLLM's bodies come too (as `/`)

# The paths several dialects share (and vLLM's own `/pooling`): path -> the rule that picks one.
SHARED_PATHS: dict[str, Callable[[Fields], Dialect]] = {
    "/rerank": _rerank,
    "/classify": _classify,
    "/score": _score,
    "/tokenize": _tokenize,
    "/pooling": lambda fields: Dialect.VLLM,
    "/v1/embeddings": _embeddings,
    "/embeddings": _embeddings,  # the same route without `/v1`
    INVOCATIONS_PATH: _sagemaker,
    "/": _sagemaker,
}


def given_fields(request: BaseModel) -> set[str]:
    """The fields a parsed body gives a value (null is no value, as vendors read it)."""
    return {name for name in request.model_fields_set if getattr(request, name) is not None}


def dialect_of(path: str, fields: Fields) -> Dialect | None:
    """The dialect of a body setting `fields` on `path`; None on a path one dialect owns."""
    rule = SHARED_PATHS.get(path)
    return rule(fields) if rule is not None else None


def error_shape(path: str, fields: Fields = ()) -> ErrorShape | None:
    """The error shape of a body setting `fields` on a shared path (with none: a body not read yet);
    None on a path one dialect owns, whose route declares its shape."""
    dialect = dialect_of(path, fields)
    return ERROR_SHAPES[dialect] if dialect is not None else None
