"""vLLM's pooling bodies and answers (pydantic only): `/pooling` is its own; `/v1/embeddings`,
`/classify`, `/score`, `/rerank` and `/tokenize` it shares with other dialects (`apis.shared`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from prensa.gateway.apis.common import (
    PROMPT,
    EmbeddingFields,
    ModelRequest,
    RelevanceOptions,
    Usage,
    VllmActivation,
    VllmEncoding,
    VllmList,
    VllmPriority,
    VllmTruncation,
)

TEXTS = "A text or a list of texts."
CUT = (
    "false refuses a pair past the model's length, as vLLM does; absent or true cuts it, as TEI, "
    "Cohere and Jina do on the same paths (prensa's, see docs/api.md's documented differences)."
)


class VllmClassifyRequest(ModelRequest, VllmTruncation, VllmActivation, VllmPriority):
    """vLLM's `/classify` body: each text classified on its own."""

    input: str | list[str] = Field(description=TEXTS)


class VllmEmbeddingRequest(EmbeddingFields, VllmTruncation, VllmEncoding, VllmPriority):
    """vLLM's `/v1/embeddings` body: OpenAI's, with vLLM's window and base64 options."""

    # NIM's, Jina's and PyLate's fields belong to the OpenAI body on this path: here, unset
    input_type: ClassVar[None] = None
    truncate: ClassVar[None] = None
    embedding_type: ClassVar[None] = None
    task: ClassVar[None] = None
    is_query: ClassVar[None] = None
    return_multivector: ClassVar[None] = None
    late_chunking: ClassVar[None] = None


class PoolingRequest(ModelRequest, VllmTruncation, VllmEncoding, VllmPriority):
    """vLLM's `/pooling` body: each input's pooled vector (`embed`) or its tokens' vectors (`token_embed`)."""

    input: str | list[str] = Field(description=TEXTS)
    task: Literal["embed", "token_embed"] = Field(
        "embed",
        description="embed: the model's pooled, L2-normalised "
        "vector; token_embed: the encoder's vector of every token.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="base64: the vector's bytes (`embed_dtype`, `endianness`; `embed` only).",
    )


class VllmRerankRequest(
    ModelRequest, RelevanceOptions, VllmTruncation, VllmActivation, VllmPriority
):
    """vLLM's `/rerank` body (LiteLLM's `hosted_vllm/` sends it)."""

    documents: list[str] = Field(description="Documents to score against the query.")
    return_documents: bool | None = Field(
        None,
        description='Echo each document as `{"text": ...}` (as a string with the gateway\'s '
        "--rerank-document-strings).",
    )
    truncate: bool | None = Field(None, description=CUT)


class VllmScoreRequest(ModelRequest, VllmTruncation, VllmActivation, VllmPriority):
    """vLLM's `/score` body: pairs of a first and a second text, by any of the names vLLM gives them."""

    text_1: str | list[str] | None = Field(
        None, description="The first text of each pair (one for all, or one per `text_2`)."
    )
    text_2: str | list[str] | None = Field(None, description="The second text of each pair.")
    queries: str | list[str] | None = Field(None, description="vLLM's newer name for `text_1`.")
    documents: str | list[str] | None = Field(None, description="vLLM's newer name for `text_2`.")
    items: str | list[str] | None = Field(None, description="vLLM's other name for `text_2`.")
    data_1: str | list[str] | None = Field(None, description="vLLM's other name for `text_1`.")
    data_2: str | list[str] | None = Field(None, description="vLLM's other name for `text_2`.")
    truncate: bool | None = Field(None, description=CUT)


class VllmTokenizeRequest(ModelRequest):
    """vLLM's `/tokenize` body: one text."""

    prompt: str = Field(
        description="The text, answered `{count, max_model_len, tokens, token_strs}`."
    )
    add_special_tokens: bool = Field(
        True, description="Add the model's special tokens ([CLS], </s>, ...)."
    )
    prompt_name: str | None = Field(None, description=PROMPT)
    return_token_strs: bool = Field(False, description="Each token's string in `token_strs`.")


class VllmPooled(BaseModel):
    index: int = Field(description="Position of the input.")
    object: str = Field("pooling", description="Always `pooling`.")
    data: list[float] | list[list[float]] | str = Field(
        description="The vector, the tokens' vectors, or base64."
    )


class VllmPoolings(VllmList):
    """vLLM's answer to `/pooling`."""

    data: list[VllmPooled] = Field(description="One per input, in input order.")


class VllmClassification(BaseModel):
    index: int = Field(description="Position of the input.")
    label: str = Field(description="The most likely label.")
    probs: list[float] = Field(
        description="Softmax (several labels) or sigmoid (one label) of each label's logit."
    )
    num_classes: int = Field(description="How many labels.")


class VllmClassifications(VllmList):
    """vLLM's answer to `/classify`."""

    data: list[VllmClassification] = Field(description="One per input, in input order.")


class RankedDocument(BaseModel):
    text: str = Field(description="The document.")


class VllmRank(BaseModel):
    relevance_score: float = Field(description="Sigmoid of the logit, or the logit.")
    index: int = Field(description="Position of the document in `documents`.")
    document: RankedDocument | str | None = Field(
        None,
        description='The document, with `return_documents`: `{"text": ...}`, or a string with '
        "--rerank-document-strings.",
    )


class VllmRerank(BaseModel):
    """vLLM's answer to `/rerank`."""

    object: str = Field("rerank", description="Always `rerank`.")
    results: list[VllmRank] = Field(description="Documents by score, best first.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")
    id: str = Field(description="A fresh id.")
    created: int = Field(description="Unix seconds.")


class VllmScore(BaseModel):
    index: int = Field(description="Position of the pair.")
    object: str = Field("score", description="Always `score`.")
    score: float = Field(
        description="A reranker's sigmoid score, or an embedder's cosine similarity."
    )


class VllmScores(VllmList):
    """vLLM's answer to `/score`."""

    data: list[VllmScore] = Field(description="One score per pair, in pair order.")


class VllmTokens(BaseModel):
    """vLLM's answer to `/tokenize`."""

    count: int = Field(description="How many tokens.")
    max_model_len: int = Field(description="Max tokens per input, special tokens included.")
    tokens: list[int] = Field(description="Token ids.")
    token_strs: list[str] | None = Field(
        description="Each token's string, with `return_token_strs`."
    )
