"""OpenAI `/v1/embeddings` and Cohere/Jina-style `/v1/rerank` shapes (pydantic only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# One text, one token-id list, or a batch mixing both (TEI accepts the mix too).
EmbeddingInput = str | list[int] | list[str | list[int]]


class EmbeddingRequest(BaseModel):
    input: EmbeddingInput = Field(description="A text, a list of token ids, or a list of texts and/or token-id lists.")
    model: str | None = Field(None, description="Served model name; the gateway's default embedding model when absent.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`float`: JSON numbers; `base64`: little-endian float32 bytes, base64-encoded.")
    dimensions: int | None = Field(None, description="Keep the first N dimensions (Matryoshka), then re-normalise.")
    user: str | None = Field(None, description="Accepted for compatibility and ignored.")


class Embedding(BaseModel):
    object: Literal["embedding"] = Field("embedding", description="Always `embedding`.")
    embedding: list[float] | str = Field(description="The vector, or its base64 float32 bytes.")
    index: int = Field(description="Position of the input in the request.")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the model read, special tokens included.")
    total_tokens: int = Field(description="Same as prompt_tokens: embedders generate nothing.")


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = Field("list", description="Always `list`.")
    data: list[Embedding] = Field(description="One embedding per input, in input order.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")


class RerankDocument(BaseModel):
    text: str = Field(description="The document text.")


class RerankRequest(BaseModel):
    query: str = Field(description="The query every document is scored against.")
    documents: list[str | RerankDocument] = Field(description="Documents as strings or `{\"text\": ...}` objects.")
    model: str | None = Field(None, description="Served reranker name; the default reranker when absent.")
    top_n: int | None = Field(None, ge=1, description="Return only the N best documents.")
    return_documents: bool = Field(True, description="Echo each document as `{\"text\": ...}` (Jina's default).")


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float = Field(description="Sigmoid of the cross-encoder logit.")
    document: RerankDocument | None = Field(None, description="The document, when `return_documents` is true.")


class RerankResponse(BaseModel):
    model: str = Field(description="The served model that answered.")
    results: list[RerankResult] = Field(description="Documents sorted by relevance, best first.")
    usage: Usage = Field(description="Token counts over all (query, document) pairs.")


class OpenAIError(BaseModel):
    message: str = Field(description="What went wrong.")
    code: int = Field(description="The HTTP status code.")
    type: str = Field(description="Error kind: Validation, Empty, NotFound, Overloaded, Backend, Unhealthy, ...")
