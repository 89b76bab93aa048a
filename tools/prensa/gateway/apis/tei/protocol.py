"""Text Embeddings Inference 1.9 request and response shapes (pydantic only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from prensa.gateway.apis.common import (
    CHUNKING,
    PROMPT,
    ChunkingRequest,
    ModelRequest,
    RelevanceOptions,
    VllmActivation,
    VllmTruncation,
)

# A text, a token-id list, or a batch mixing both.
Inputs = str | list[int] | list[str | list[int]]
Direction = Annotated[
    Literal["left", "right"], BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)
]

TRUNCATE = "Cut inputs longer than the model's max length; null means the server's --auto-truncate."
DIRECTION = "Which end to cut when truncating: `right` (default) or `left`."


class Truncation(BaseModel):
    truncate: bool | None = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("right", description=DIRECTION)


class TruncatedRequest(ModelRequest, Truncation):
    pass


class EmbedRequest(TruncatedRequest):
    inputs: Inputs = Field(
        description="A text, a token-id list, or a list of texts and/or token-id lists."
    )
    prompt_name: str | None = Field(None, description=PROMPT)
    normalize: bool = Field(True, description="L2-normalise the vectors (after `dimensions`).")
    dimensions: int | None = Field(None, description="Keep the first N dimensions (Matryoshka).")
    outputs: list[Literal["dense", "sparse", "colbert"]] | None = Field(
        None,
        min_length=1,
        description="bge-m3: answer as `/embed_m3` does, with these outputs of one forward pass.",
    )
    chunking: ChunkingRequest | None = Field(None, description=CHUNKING)


class TokenLevelRequest(TruncatedRequest):
    """`/embed_sparse`, `/embed_all` and `/embed_colbert`."""

    inputs: Inputs = Field(
        description="A text, a token-id list, or a list of texts and/or token-id lists."
    )
    prompt_name: str | None = Field(None, description=PROMPT)


class ColbertRequest(TokenLevelRequest):
    """`/embed_colbert`."""

    is_query: bool = Field(
        False,
        description="Encode the inputs as queries (PyLate's `is_query`): a late-interaction model "
        "frames them with its query marker and expands them to its query length; documents (the "
        "default) lose their punctuation's vectors. bge-m3 encodes both alike.",
    )


class SparseValue(BaseModel):
    index: int = Field(description="Vocabulary id.")
    value: float = Field(description="Its weight (> 0).")


class ClassificationParameters(BaseModel):
    """The Hugging Face Inference API's text-classification parameters (huggingface_hub sends them)."""

    top_k: int | None = Field(None, ge=1, description="Keep the K best labels per input.")
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = Field(
        None, description="`none` returns logits; the model's own activation otherwise."
    )


class PredictRequest(TruncatedRequest):
    inputs: str | list[str] | list[list[str]] = Field(
        description="A text, a pair `[text, text_pair]`, or a batch of `[text]` / `[text, text_pair]` items."
    )
    raw_scores: bool = Field(False, description="Return logits instead of softmax/sigmoid scores.")
    parameters: ClassificationParameters | None = Field(
        None,
        description="Hugging Face Inference API style: when present, the answer is always nested per input "
        "(`[[{label, score}]]`), as that API answers.",
    )


class Prediction(BaseModel):
    score: float = Field(
        description="Softmax (several labels) or sigmoid (one label) of the logit, or the logit."
    )
    label: str = Field(description="The label's name.")


class RerankRequest(TruncatedRequest, RelevanceOptions, VllmTruncation, VllmActivation):
    """TEI's `/rerank` body, with vLLM's window and activation options served on it too."""

    texts: list[str] = Field(description="Passages to score against the query.")
    raw_scores: bool = Field(False, description="Return logits instead of sigmoid scores.")
    return_text: bool = Field(False, description="Echo each passage in the response.")


class Rank(BaseModel):
    index: int = Field(description="Position of the passage in `texts`.")
    score: float = Field(description="Sigmoid of the logit, or the logit with `raw_scores`.")
    text: str | None = Field(None, description="The passage, with `return_text`.")


class SimilarityInput(BaseModel):
    source_sentence: str = Field(description="The sentence every other one is compared with.")
    sentences: list[str] = Field(description="Sentences to compare.")


class SimilarityParameters(Truncation):
    prompt_name: str | None = Field(None, description=PROMPT)


class SimilarityRequest(ModelRequest):
    inputs: SimilarityInput = Field(description="Source sentence and candidates.")
    parameters: SimilarityParameters | None = Field(None, description="Truncation options.")


class TokenizeRequest(ModelRequest):
    """TEI's `/tokenize` body."""

    inputs: str | list[str] = Field(description="A text or a list of texts.")
    add_special_tokens: bool = Field(
        True, description="Add the model's special tokens ([CLS], </s>, ...)."
    )
    prompt_name: str | None = Field(None, description=PROMPT)


class SimpleToken(BaseModel):
    id: int = Field(description="Vocabulary id.")
    text: str = Field(
        description="The input's bytes start..stop, or the token itself for special tokens."
    )
    special: bool = Field(description="Whether the tokenizer added it.")
    start: int | None = Field(
        description="UTF-8 byte offset of the token in the input (null for special tokens)."
    )
    stop: int | None = Field(
        description="UTF-8 byte offset past its end (null for special tokens)."
    )


class DecodeRequest(ModelRequest):
    ids: list[int] | list[list[int]] = Field(description="Token ids, or a list of token-id lists.")
    skip_special_tokens: bool = Field(True, description="Leave special tokens out of the text.")


class VertexRequest(BaseModel):
    instances: list[dict[str, Any]] = Field(
        description="Request bodies, each as `POST /` takes it."
    )


class VertexResponse(BaseModel):
    predictions: list[Any] = Field(description="Each instance's answer, in order.")


class ModelInfo(BaseModel):
    model_id: str = Field(description="Where the model came from (Hub id or directory).")
    model_sha: str | None = Field(description="Hub commit, or a content hash of a local directory.")
    model_dtype: str = Field(description="Exported precision.")
    served_model_name: str = Field(description="The name to request.")
    model_type: dict[Any, Any] = Field(
        description="`{embedding: {pooling}}`, `{classifier: {id2label, label2id}}` or `{reranker: ...}`."
    )
    task: str = Field(description="prensa task: embed, m3, rerank, classify or splade.")
    max_input_length: int = Field(description="Max tokens per input, special tokens included.")
    max_batch_tokens: int | None = Field(description="Token budget of one encoder pass in Triton.")
    max_batch_requests: int = Field(description="Rows per Triton call.")
    prompts: dict[str, str] = Field(
        description="Prompts from the model's sentence-transformers config, by name."
    )


class Info(ModelInfo):
    max_concurrent_requests: int = Field(description="Inputs in flight before 429.")
    max_client_batch_size: int = Field(description="Inputs per request before 422 (or splitting).")
    auto_truncate: bool = Field(description="What `truncate: null` means.")
    tokenization_workers: int | None = Field(description="Tokenization runs in Triton; null here.")
    version: str = Field(description="prensa version.")
    models: list[ModelInfo] = Field(description="Every served model.")
