"""bge-m3 in one call (`/embed_m3`) and its hybrid relevance scores (`/score`): prensa's own
shapes, in TEI's style, as pydantic models only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prensa.gateway.apis.common import (
    CHUNKING,
    PROMPT,
    ChunkingRequest,
    VllmActivation,
    VllmTruncation,
)
from prensa.gateway.apis.tei.protocol import Inputs, SparseValue, TruncatedRequest

M3Output = Literal["dense", "sparse", "colbert"]
ColbertEncoding = Literal["float", "base64", "base64_float16"]
WEIGHTS = (
    "Weights of the dense, sparse and ColBERT scores in the mixed modes (FlagEmbedding's "
    "`weights_for_different_modes`). Default [0.4, 0.2, 0.4]."
)


class M3Request(TruncatedRequest):
    inputs: Inputs = Field(
        description="A text, a token-id list, or a list of texts and/or token-id lists."
    )
    outputs: list[M3Output] = Field(
        ["dense", "sparse", "colbert"],
        min_length=1,
        description="Which of bge-m3's outputs to return, from one forward pass.",
    )
    prompt_name: str | None = Field(None, description=PROMPT)
    return_tokens: bool = Field(
        False,
        description="Give each sparse weight's token as well (FlagEmbedding's "
        "`convert_id_to_token`).",
    )
    colbert_encoding: ColbertEncoding = Field(
        "float",
        description="ColBERT vectors as JSON floats, or as base64 of little-endian float32 / float16 "
        "(row-major, `shape` rows x dim): about a half / a quarter of the JSON's size.",
    )
    chunking: ChunkingRequest | None = Field(None, description=CHUNKING)


class SparseWeight(SparseValue):
    token: str | None = Field(None, description="The id decoded, with `return_tokens`.")


class EncodedVectors(BaseModel):
    encoding: ColbertEncoding = Field(description="base64 or base64_float16.")
    shape: list[int] = Field(description="[tokens - 1, dim]: one vector per token after the first.")
    data: str = Field(description="base64 of the row-major little-endian floats.")


class M3Embedding(BaseModel):
    dense: list[float] | None = Field(None, description="The L2-normalised CLS vector.")
    sparse: list[SparseWeight] | None = Field(
        None, description="Non-zero lexical weights, ascending ids."
    )
    colbert: list[list[float]] | EncodedVectors | None = Field(
        None, description="One L2-normalised vector per token after the first (CLS dropped)."
    )
    num_tokens: int = Field(
        description="Tokens read, special tokens included (over all windows when chunked)."
    )
    chunks: int | None = Field(
        None, description="Windows the input took, when long inputs were chunked."
    )


class ScoreRequest(TruncatedRequest, VllmTruncation, VllmActivation):
    """prensa's bge-m3 `/score` body; vLLM's window and activation options are served on it too
    (a hybrid score has no activation: `use_activation` leaves it as it is)."""

    query: str = Field(description="The query.")
    passages: list[str] = Field(description="Passages to score against the query.")
    weights: list[float] | None = Field(None, min_length=3, max_length=3, description=WEIGHTS)


class HybridScore(BaseModel):
    """One passage's scores, named as FlagEmbedding's `compute_score` names its modes."""

    index: int = Field(description="Position of the passage in `passages`.")
    dense: float = Field(description="Dot product of the normalised dense vectors.")
    sparse: float = Field(description="Lexical match: shared ids' weights multiplied and summed.")
    colbert: float = Field(
        description="Mean over query tokens of the best dot product with a passage token."
    )
    sparse_dense: float = Field(
        alias="sparse+dense", description="Weighted mean of dense and sparse."
    )
    colbert_sparse_dense: float = Field(
        alias="colbert+sparse+dense", description="Weighted mean of all three."
    )
