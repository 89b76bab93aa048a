"""NIM's `/v1/ranking` shapes (pydantic only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class RankingText(BaseModel):
    text: str = Field(description="The text.")


class RankingRequest(BaseModel):
    """NIM's text reranking (`/v1/ranking`)."""

    model: str | None = Field(
        None, description="Served reranker name; the default reranker when absent."
    )
    query: RankingText = Field(description="The query.")
    passages: list[RankingText] = Field(description="Passages to score against the query.")
    truncate: Literal["NONE", "END"] | None = Field(
        None,
        description="NONE: refuse (query, passage) pairs over the model's max length; END: cut the passage. "
        "Default: --auto-truncate.",
    )


class Ranking(BaseModel):
    index: int = Field(description="Position of the passage in `passages`.")
    logit: float = Field(description="The cross-encoder's raw logit.")


class RankingResponse(BaseModel):
    rankings: list[Ranking] = Field(description="Passages sorted by logit, best first.")
