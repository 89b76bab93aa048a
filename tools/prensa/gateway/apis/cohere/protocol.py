"""Cohere's v1/v2 rerank and embed shapes, and Jina's rerank (Cohere's v1 shape with its own
defaults), as pydantic models only."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prensa.gateway.apis.common import (
    INPUT_TYPE,
    InputType,
    TruncateEnd,
    Usage,
    VllmActivation,
    VllmTruncation,
)

CohereTruncate = TruncateEnd
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
TRUNCATE = (
    "NONE: refuse inputs over the model's max length; START / END: cut that end. Default END."
)
MODEL = "Served model name; the default model that can answer when absent."


class RerankDocument(BaseModel):
    # Cohere documents may carry more fields; `text` is ranked
    model_config = ConfigDict(extra="allow")

    text: str = Field(description="The document text.")


Documents = list[str | RerankDocument]
DOCUMENTS = 'Documents as strings or `{"text": ...}` objects.'
TOP_N = "Return only the N best documents."
INSTRUCTION = (
    "An LLM reranker's task instruction (Qwen3-Reranker's `<Instruct>`), in place of the model's "
    "default; refused for cross-encoders (prensa's own field)."
)


MAX_TOKENS_PER_DOC = "Cut each document to its first N tokens first (Cohere v2's, vLLM's)."


class RerankV1Request(VllmTruncation, VllmActivation):
    """Cohere's `/v1/rerank` and Jina's `/v1/rerank`, and vLLM's body there."""

    model: str | None = Field(None, description=MODEL)
    query: str = Field(description="The query every document is scored against.")
    documents: Documents = Field(description=DOCUMENTS)
    top_n: int | None = Field(None, ge=1, description=TOP_N)
    return_documents: bool | None = Field(
        None,
        description='Echo each document as `{"text": ...}`. Default: true (Jina), false for Cohere\'s SDKs.',
    )
    max_chunks_per_doc: int | None = Field(
        None,
        ge=1,
        description="Split long documents into up to N windows beside the query; a document scores "
        "its best window (Cohere v1). Absent: documents are truncated.",
    )
    max_tokens_per_doc: int | None = Field(None, ge=1, description=MAX_TOKENS_PER_DOC)
    instruction: str | None = Field(None, description=INSTRUCTION)


class RerankV2Request(VllmTruncation, VllmActivation):
    """Cohere's `/v2/rerank`, and vLLM's body there."""

    model: str | None = Field(None, description=MODEL)
    query: str = Field(description="The query every document is scored against.")
    documents: Documents = Field(description=DOCUMENTS)
    top_n: int | None = Field(None, ge=1, description=TOP_N)
    max_tokens_per_doc: int | None = Field(None, ge=1, description=MAX_TOKENS_PER_DOC)
    return_documents: bool | None = Field(
        None,
        description='Echo each document as `{"text": ...}`; absent: echoed (as vLLM, whose clients '
        "read them), false: left out.",
    )
    instruction: str | None = Field(None, description=INSTRUCTION)


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float = Field(description="Sigmoid of the cross-encoder logit.")
    document: RerankDocument | None = Field(
        None, description="The document, when `return_documents` is true."
    )


class RerankResponse(BaseModel):
    id: str = Field(description="A fresh id per response.")
    model: str = Field(description="The served model that answered.")
    results: list[RerankResult] = Field(description="Documents sorted by relevance, best first.")
    usage: Usage = Field(description="Token counts over all (query, document) pairs (Jina).")
    meta: dict[Any, Any] = Field(description="Cohere's `api_version` and `billed_units`.")


class CohereEmbedRequest(BaseModel):
    """Cohere's `/v1/embed` and `/v2/embed` (texts only)."""

    model: str | None = Field(None, description=MODEL)
    texts: list[str] = Field(description="Texts to embed.")
    input_type: InputType | None = Field(None, description=INPUT_TYPE)
    embedding_types: list[EmbeddingType] | None = Field(
        None,
        description="float, int8/uint8 (per-dimension ranges calibrated at export, as sentence-transformers' "
        "quantize_embeddings), binary/ubinary (sign bits packed), base64 (float32 bytes). "
        "Default float.",
    )
    truncate: CohereTruncate = Field("END", description=TRUNCATE)
    output_dimension: int | None = Field(
        None, ge=1, description="Keep the first N dimensions, re-normalised."
    )
    max_tokens: int | None = Field(
        None, ge=1, description="Cut each text to N tokens (special tokens included)."
    )


class CohereEmbedResponse(BaseModel):
    id: str = Field(description="A fresh id per response.")
    embeddings: dict[str, list[Any]] | list[list[float]] = Field(
        description="By type (`embeddings_by_type`), or float vectors (`embeddings_floats`, v1 without types)."
    )
    texts: list[str] = Field(description="The inputs, as given.")
    meta: dict[Any, Any] = Field(description="Cohere's `api_version` and `billed_units`.")
    response_type: Literal["embeddings_floats", "embeddings_by_type"] = Field(
        description="Which shape `embeddings` has."
    )
