"""Wire pieces several APIs share (pydantic and plain values only): token counts, the chunking
field, the input roles of NIM and Cohere, and their `truncate` ends."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prensa.gateway.chunking import DEFAULT_OVERLAP


class Usage(BaseModel):
    """Token counts as OpenAI, Jina, Infinity and vLLM report them."""

    prompt_tokens: int = Field(description="Tokens the model read, special tokens included.")
    total_tokens: int = Field(
        description="Same as prompt_tokens: embedders and rerankers generate nothing."
    )


class VllmUsage(Usage):
    completion_tokens: int = Field(0, description="Always 0.")


class VllmList(BaseModel):
    """What every vLLM pooling answer (`/score`, `/classify`, `/pooling`) has around its `data`."""

    id: str = Field(description="A fresh id.")
    object: str = Field("list", description="Always `list`.")
    created: int = Field(description="Unix seconds.")
    model: str = Field(description="The served model that answered.")
    usage: VllmUsage = Field(description="Token counts.")


class ChunkingRequest(BaseModel):
    enabled: bool = Field(
        True, description="Cut inputs over the model's max length into windows and combine them."
    )
    overlap: int = Field(
        DEFAULT_OVERLAP, ge=0, description="Tokens two neighbouring windows share."
    )


CHUNKING = (
    "Long inputs as overlapping windows combined into one answer instead of truncated; absent: the "
    "server's --chunk-long-inputs."
)


def asked_chunking(asked: ChunkingRequest | None) -> tuple[bool | None, int]:
    """A request's `chunking` as `Service.chunking` takes it: (enabled, overlap), enabled None when
    the request does not say."""
    return (None, DEFAULT_OVERLAP) if asked is None else (asked.enabled, asked.overlap)


InputType = Literal[
    "query",
    "passage",
    "document",
    "search_query",
    "search_document",
    "classification",
    "clustering",
]
INPUT_TYPE = (
    "What the inputs are: query/passage (NIM), search_query/search_document/classification/clustering "
    "(Cohere). Picks the model's prompt of that role when its sentence-transformers config has one."
)

# NIM's and Cohere's `truncate`: none, cut the start, or cut the end.
TruncateEnd = Literal["NONE", "START", "END"]
TRUNCATE_ENDS: dict[str, tuple[bool, str]] = {
    "NONE": (False, "right"),
    "START": (True, "left"),
    "END": (True, "right"),
}


def truncate_end(truncate: str | None) -> tuple[bool | None, str]:
    """NIM's or Cohere's `truncate` as `Service.truncation` takes it: (truncate, direction), None
    leaving it to --auto-truncate."""
    return TRUNCATE_ENDS[truncate] if truncate else (None, "right")
