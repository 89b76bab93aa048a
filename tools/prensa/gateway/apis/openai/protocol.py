"""OpenAI `/v1/embeddings` (with NIM's `input_type` and `truncate`, Jina's and PyLate's fields; vLLM's
body on the same path is `vllm.protocol`'s) and `/v1/models` shapes (pydantic only)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from prensa.gateway.apis.common import (
    INPUT_TYPE,
    EmbeddingFields,
    InputType,
    TruncateEnd,
    Usage,
)

# NIM's (float, int8, uint8, binary, ubinary) and Jina's (float, base64, binary, ubinary) `embedding_type`.
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
EMBEDDING_TYPE = (
    "NIM's and Jina's precision: float; int8/uint8 (the model's calibration ranges, full dimension), "
    "binary/ubinary (sign bits packed eight to a byte): integer lists; base64 as `encoding_format`."
)
JinaTask = Literal[
    "retrieval.query", "retrieval.passage", "text-matching", "classification", "separation"
]
JINA_TASK = (
    "Jina's task: the model's prompt of that name when it has one; else retrieval.query and "
    "retrieval.passage act as `input_type` query and passage, and the other tasks are refused."
)
NimTruncate = TruncateEnd
NIM_TRUNCATE = "NONE: refuse inputs over the model's max length; START / END: cut that end. Default: --auto-truncate."


class EmbeddingRequest(EmbeddingFields):
    """OpenAI's body, with the fields NIM, Jina and PyLate's server add to it."""

    # vLLM's options belong to vLLM's body on this path (a body with one is vLLM's): here, unset
    truncate_prompt_tokens: ClassVar[None] = None
    truncation_side: ClassVar[None] = None
    embed_dtype: ClassVar[Literal["float32"]] = "float32"
    endianness: ClassVar[Literal["native"]] = "native"

    input_type: InputType | None = Field(None, description=INPUT_TYPE)
    truncate: NimTruncate | None = Field(None, description=NIM_TRUNCATE)
    embedding_type: EmbeddingType | None = Field(None, description=EMBEDDING_TYPE)
    task: JinaTask | None = Field(None, description=JINA_TASK)
    is_query: bool | None = Field(
        None,
        description="PyLate's server: read the inputs as queries (true) or documents (false) of a "
        "late-interaction model, each `embedding` then its token vectors. Without it such a model "
        "reads them by `input_type` or `task`, else as queries, as PyLate's server does.",
    )
    return_multivector: bool | None = Field(
        None,
        description="Jina's multi-vector output: each input's token vectors (a late-interaction "
        "model's, or bge-m3's ColBERT vectors) in `embeddings` instead of one `embedding`; queries "
        "with `task` retrieval.query or `input_type` query.",
    )
    late_chunking: bool | None = Field(
        None,
        description="Jina's late chunking: the inputs are chunks of one document, read together in "
        "one pass (at most the model's max length), each embedded as the mean of its own tokens.",
    )


class Embedding(BaseModel):
    object: Literal["embedding"] = Field("embedding", description="Always `embedding`.")
    embedding: list[float] | list[int] | str | list[list[float]] = Field(
        description="The vector; integers for an int8/uint8/binary/ubinary `embedding_type`; or base64 "
        "float32 bytes; a late-interaction model's token vectors, as PyLate's server answers them."
    )
    chunks: int | None = Field(
        None, description="With `chunking`: how many windows the input was embedded as."
    )
    index: int = Field(description="Position of the input in the request.")


class MultiVector(BaseModel):
    object: Literal["embeddings"] = Field("embeddings", description="Always `embeddings`.")
    embeddings: list[list[float]] = Field(description="One vector per token the model keeps.")
    index: int = Field(description="Position of the input in the request.")


class MultiVectorResponse(BaseModel):
    object: Literal["list"] = Field("list", description="Always `list`.")
    data: list[MultiVector] = Field(description="One set of vectors per input, in input order.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = Field("list", description="Always `list`.")
    data: list[Embedding] = Field(description="One embedding per input, in input order.")
    model: str = Field(description="The served model that answered.")
    usage: Usage = Field(description="Token counts.")


class ModelCard(BaseModel):
    id: str = Field(description="The name to request.")
    object: Literal["model"] = Field("model", description="Always `model`.")
    created: int = Field(description="When the gateway first saw the model (Unix seconds).")
    owned_by: str = Field(description="Always `prensa`.")
    root: str = Field(
        description="The model's own id: a base model, not an adapter (NIM clients pick such models)."
    )
    task: str = Field(description="prensa task: embed, m3, rerank, classify or splade.")
    max_model_len: int = Field(description="Max tokens per input, special tokens included.")
    backend: str = Field(description="Always `triton` (Infinity's field).")
    capabilities: list[str] = Field(description="Infinity's names: embed, rerank, classify.")
    stats: dict[str, float] = Field(
        description="Infinity's: rows per Triton call, and the gateway's inputs in flight (of all models)."
    )


class ModelList(BaseModel):
    object: Literal["list"] = Field("list", description="Always `list`.")
    data: list[ModelCard] = Field(description="Every served model.")
