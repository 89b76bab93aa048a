"""Infinity's bodies and answers where they differ from the other dialects of a path (pydantic
only): `/rerank` and `/classify` with Infinity's `raw_scores` (`apis.dialects` tells them apart)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from prensa.gateway.apis.common import ModelRequest, RelevanceOptions, Usage

RAW_SCORES = "Logits instead of sigmoid or softmax scores."


class InfinityRerankRequest(ModelRequest, RelevanceOptions):
    """Infinity's `/rerank` body."""

    documents: list[str] = Field(description="Documents to score against the query.")
    raw_scores: bool = Field(False, description=RAW_SCORES)
    return_documents: bool = Field(False, description="Echo each document as a string.")


class InfinityClassifyRequest(ModelRequest):
    """Infinity's `/classify` body."""

    input: str | list[str] = Field(description="A text or a list of texts.")
    raw_scores: bool = Field(False, description=RAW_SCORES)


class InfinityRank(BaseModel):
    relevance_score: float = Field(description="Sigmoid of the logit, or the logit.")
    index: int = Field(description="Position of the document in `documents`.")
    document: str | None = Field(None, description="The document, with `return_documents`.")


class InfinityRerank(BaseModel):
    """Infinity's answer to `/rerank`."""

    object: str = Field("rerank", description="Always `rerank`.")
    results: list[InfinityRank] = Field(description="Documents by score, best first.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")
    id: str = Field(description="A fresh id.")
    created: int = Field(description="Unix seconds.")


class InfinityLabel(BaseModel):
    score: float = Field(description="Softmax or sigmoid of the label's logit, or the logit.")
    label: str = Field(description="The label's name.")


class InfinityClassifications(BaseModel):
    """Infinity's answer to `/classify`."""

    object: str = Field("classify", description="Always `classify`.")
    data: list[list[InfinityLabel]] = Field(
        description="Per input, every label by score, best first."
    )
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")
    id: str = Field(description="A fresh id.")
    created: int = Field(description="Unix seconds.")
