"""Wire pieces several APIs share (pydantic and plain values only): the `model` field, token
counts, the chunking field, prensa's relevance options, the input roles of NIM and Cohere, their
`truncate` ends, and vLLM's pooling options."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, Field

from prensa.gateway.core.chunking import DEFAULT_OVERLAP
from prensa.gateway.core.encodings import EmbedDType, Endianness
from prensa.gateway.core.request_context import Priority, RequestContext
from prensa.gateway.errors import validation

MODEL = "Served model name (as `?model=`); the default model when absent."
PROMPT = "Name of a prompt from the model's sentence-transformers config to prepend; unknown names are refused."


class ModelRequest(BaseModel):
    """Every inference body may name its model, as OpenAI's, Cohere's and LiteLLM's clients do."""

    model: str | None = Field(None, description=MODEL)


class RelevanceOptions(BaseModel):
    """What every dialect's `/rerank` body takes: the query, and the options prensa serves on each
    (vLLM's `top_n` and `max_tokens_per_doc`, bge-m3's weights, an LLM reranker's instruction)."""

    query: str = Field(description="The query.")
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
        description="bge-m3 only (its `colbert+sparse+dense` score): weights of dense, sparse and "
        "ColBERT; default [0.4, 0.2, 0.4].",
    )
    instruction: str | None = Field(
        None,
        description="An LLM reranker's task instruction (Qwen3-Reranker's `<Instruct>`), in place "
        "of the model's default; refused for cross-encoders (prensa's own field).",
    )


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


class VllmTruncation(BaseModel):
    truncate_prompt_tokens: int | None = Field(
        None,
        ge=-1,
        description="vLLM's: keep each input's first N tokens, special tokens included (at most the "
        "model's max length); -1: cut at the model's max length; absent: --auto-truncate.",
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None,
        description="vLLM's: which end a cut input loses (right: its first tokens are kept); "
        "default right, or the body's own direction.",
    )


class VllmPriority(BaseModel):
    priority: int = Field(
        0,
        description="vLLM's: lower goes earlier; above 0 waits as bulk work, behind online requests "
        "(as the header `x-prensa-priority: bulk`).",
    )


def read_priority(request: object, context: RequestContext) -> None:
    """vLLM's `priority` above 0 makes the request bulk work (the header says it for any body)."""
    if isinstance(request, VllmPriority) and request.priority > 0:
        context.priority = Priority.BULK


class SaysCutSide(Protocol):
    """A body that may say vLLM's `truncation_side` (unset where its dialect has no such field)."""

    @property
    def truncation_side(self) -> Literal["left", "right"] | None: ...


def cut_side(body: SaysCutSide, direction: str = "right", said: bool = False) -> str:
    """Which end inputs are cut from: vLLM's `truncation_side`, else `direction` (the body's own
    field, `said` when the body gave it); the two disagreeing are refused."""
    if body.truncation_side is None:
        return direction
    if said and direction != body.truncation_side:
        raise validation(
            f"`truncation_side` {body.truncation_side} and the body's truncation direction "
            f"{direction} disagree"
        )
    return body.truncation_side


class VllmEncoding(BaseModel):
    """vLLM's options for base64 vectors; float vectors are JSON numbers whatever they say, as vLLM's."""

    embed_dtype: EmbedDType = Field(
        "float32", description="The type base64 vectors are written in (vLLM's)."
    )
    endianness: Endianness = Field(
        "native",
        description="Their byte order (vLLM's); native is the server's (little on x86 and ARM).",
    )


class VllmActivation(BaseModel):
    """vLLM's switch between a cross-encoder's scores and its raw logits."""

    use_activation: bool | None = Field(
        None,
        description="vLLM's: false answers the logit (as `raw_scores`), true the activated score.",
    )
    activation: bool | None = Field(None, description="vLLM's earlier name of `use_activation`.")


def activated(raw_scores: bool | None, body: VllmActivation) -> bool:
    """Whether scores come activated (sigmoid or softmax) rather than raw: `raw_scores` (TEI's,
    Infinity's) and vLLM's `use_activation` / `activation`; fields that disagree are refused."""
    said = {
        name: value
        for name, value in (
            ("raw_scores", None if raw_scores is None else not raw_scores),
            ("use_activation", body.use_activation),
            ("activation", body.activation),
        )
        if value is not None
    }
    if len(set(said.values())) > 1:
        raise validation(f"{' and '.join(f'`{name}`' for name in said)} disagree")
    return next(iter(said.values()), True)


# One text, one token-id list, or a batch mixing both (TEI accepts the mix too).
EmbeddingInput = str | list[int] | list[str | list[int]]


class EmbeddingFields(BaseModel):
    """OpenAI's `/v1/embeddings` body, as every dialect on that path extends it (vLLM's `normalize`
    and prensa's `chunking` included)."""

    input: EmbeddingInput = Field(
        description="A text, a list of token ids, or a list of texts and/or token-id lists."
    )
    model: str | None = Field(
        None, description="Served model name; the gateway's default embedding model when absent."
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="`float`: JSON numbers; `base64`: the vector's bytes base64-encoded (float32, "
        "little-endian unless vLLM's `embed_dtype` and `endianness` say otherwise).",
    )
    dimensions: int | None = Field(
        None, description="Keep the first N dimensions (Matryoshka), then re-normalise."
    )
    normalize: bool | None = Field(
        None,
        description="vLLM's: false answers the vectors unnormalised; absent or true L2-normalised.",
    )
    user: str | None = Field(None, description="Accepted for compatibility and ignored.")
    chunking: ChunkingRequest | None = Field(
        None, description=CHUNKING + " Each embedding then says its `chunks`."
    )
