"""Text Embeddings Inference 1.9 request and response shapes (pydantic only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from prensa.gateway.apis.common import (
    CHUNKING,
    ChunkingRequest,
    Usage,
    VllmActivation,
    VllmEncoding,
    VllmList,
    VllmTruncation,
)

# A text, a token-id list, or a batch mixing both.
Inputs = str | list[int] | list[str | list[int]]
Direction = Annotated[
    Literal["left", "right"], BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)
]

TRUNCATE = "Cut inputs longer than the model's max length; null means the server's --auto-truncate."
DIRECTION = "Which end to cut when truncating: `right` (default) or `left`."
PROMPT = "Name of a prompt from the model's sentence-transformers config to prepend; unknown names are refused."
MODEL = "Served model name (as `?model=`); the default model when absent."


class ModelRequest(BaseModel):
    """Every inference body may name its model, as OpenAI's, Cohere's and LiteLLM's clients do."""

    model: str | None = Field(None, description=MODEL)


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


class RerankRequest(TruncatedRequest, VllmTruncation, VllmActivation):
    """TEI's body (`texts`), or vLLM's and Infinity's (`documents`, answered in their shape)."""

    query: str = Field(description="The query.")
    texts: list[str] | None = Field(
        None,
        description="Passages to score against the query (TEI); required "
        "unless `documents` is given.",
    )
    documents: list[str] | None = Field(
        None,
        description="Passages in vLLM's and Infinity's body: the answer is then theirs, "
        "`{object, id, model, usage, results, created}`.",
    )
    raw_scores: bool = Field(False, description="Return logits instead of sigmoid scores.")
    return_text: bool = Field(
        False, description="Echo each passage in the response (with `texts`)."
    )
    return_documents: bool | None = Field(
        None,
        description="With `documents`: each comes as `{\"text\": ...}` (vLLM's, Cohere's and "
        "Jina's); true with Infinity's `raw_scores` in the body (or the gateway's "
        "--rerank-document-strings) echoes each as a string (Infinity's).",
    )
    top_n: int | None = Field(None, gt=0, description="Keep only the N best.")
    max_tokens_per_doc: int | None = Field(
        None,
        ge=1,
        description="Cut each passage to its first N tokens first (vLLM's, Cohere v2's).",
    )
    weights: list[float] | None = Field(
        None,
        min_length=3,
        max_length=3,
        description="bge-m3 only (its `colbert+sparse+dense` score): weights of dense, sparse and ColBERT; "
        "default [0.4, 0.2, 0.4].",
    )
    instruction: str | None = Field(
        None,
        description="An LLM reranker's task instruction (Qwen3-Reranker's `<Instruct>`), in place of the "
        "model's default; refused for cross-encoders (prensa's own field).",
    )


class Rank(BaseModel):
    index: int = Field(description="Position of the passage in `texts`.")
    score: float = Field(description="Sigmoid of the logit, or the logit with `raw_scores`.")
    text: str | None = Field(None, description="The passage, with `return_text`.")


class RankedDocument(BaseModel):
    text: str = Field(description="The document.")


class InfinityRank(BaseModel):
    relevance_score: float = Field(
        description="Sigmoid of the logit, or the logit with `raw_scores`."
    )
    index: int = Field(description="Position of the document in `documents`.")
    document: RankedDocument | str = Field(
        description="The document: `{\"text\": ...}` (vLLM's), or the string Infinity's body asks for "
        "(`return_documents` with `raw_scores`, see `RerankRequest.return_documents`)."
    )


class ClassifyRequest(ModelRequest, VllmTruncation, VllmActivation):
    """vLLM's `/classify` body, or Infinity's: the same `input` and `model`; a body with Infinity's
    `raw_scores` (true or false) is answered in Infinity's shape, any other in vLLM's."""

    input: str | list[str] = Field(
        description="A text or a list of texts, each classified on its own."
    )
    raw_scores: bool | None = Field(
        None,
        description="Infinity's: logits instead of probabilities; present, the "
        "answer is Infinity's `{object: classify, data: [[{score, label}]]}`.",
    )


class PoolingRequest(ModelRequest, VllmTruncation, VllmEncoding):
    """vLLM's `/pooling` body: each input's pooled vector (`embed`) or its tokens' vectors (`token_embed`)."""

    input: str | list[str] = Field(description="A text or a list of texts.")
    task: Literal["embed", "token_embed"] = Field(
        "embed",
        description="embed: the model's pooled, L2-normalised "
        "vector; token_embed: the encoder's vector of every token.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="base64: the vector's bytes (`embed_dtype`, `endianness`; `embed` only).",
    )


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


class InfinityClassifications(BaseModel):
    """Infinity's answer to `/classify` (a body with `raw_scores`)."""

    object: str = Field("classify", description="Always `classify`.")
    data: list[list[Prediction]] = Field(description="Per input, every label by score, best first.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")
    id: str = Field(description="A fresh id.")
    created: int = Field(description="Unix seconds.")


class InfinityRerank(BaseModel):
    """vLLM's and Infinity's answer to a `/rerank` body with `documents`: the same but for `document`."""

    object: str = Field("rerank", description="Always `rerank`.")
    results: list[InfinityRank] = Field(description="Documents by score, best first.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")
    id: str = Field(description="A fresh id.")
    created: int = Field(description="Unix seconds.")


class SimilarityInput(BaseModel):
    source_sentence: str = Field(description="The sentence every other one is compared with.")
    sentences: list[str] = Field(description="Sentences to compare.")


class SimilarityParameters(Truncation):
    prompt_name: str | None = Field(None, description=PROMPT)


class SimilarityRequest(ModelRequest):
    inputs: SimilarityInput = Field(description="Source sentence and candidates.")
    parameters: SimilarityParameters | None = Field(None, description="Truncation options.")


class TokenizeRequest(ModelRequest):
    """TEI's body (`inputs`), or vLLM's (`prompt`), answered in its own shape."""

    inputs: str | list[str] | None = Field(
        None, description="A text or a list of texts (TEI's); or give `prompt`."
    )
    prompt: str | None = Field(
        None,
        description="vLLM's: one text, answered `{count, max_model_len, tokens, token_strs}`.",
    )
    add_special_tokens: bool = Field(
        True, description="Add the model's special tokens ([CLS], </s>, ...)."
    )
    prompt_name: str | None = Field(None, description=PROMPT)
    return_token_strs: bool = Field(
        False, description="vLLM's: each token's string in `token_strs` (with `prompt`)."
    )


class VllmTokens(BaseModel):
    """vLLM's answer to `/tokenize` with `prompt`."""

    count: int = Field(description="How many tokens.")
    max_model_len: int = Field(description="Max tokens per input, special tokens included.")
    tokens: list[int] = Field(description="Token ids.")
    token_strs: list[str] | None = Field(
        description="Each token's string, with `return_token_strs`."
    )


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
