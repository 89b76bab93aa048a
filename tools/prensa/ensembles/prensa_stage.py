"""The tensor contract between prensa's Triton stages, and helpers every stage shares.

This file is copied beside each stage's `model.py` in a rendered model repository (Triton puts
the version directory on `sys.path`), so stages run in any Triton with numpy and need no
prensa install. The repository generator reads the same names from here: one place defines
what crosses each stage boundary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton: by prensa, and by unit tests of the stages
    pb_utils = None

# Ensemble inputs: raw UTF-8 text, one element per row; `text_pair` is the second segment
# (rerank passages, classifier pairs).
TEXT = "text"
TEXT_PAIR = "text_pair"

# tokenize -> encode / pool: int64, each request right-padded to its own longest row.
INPUT_IDS = "input_ids"
# 1 for a token, 0 for padding, and PROMPT_TOKEN for a prompt token that the model attends to but
# its pooling leaves out (sentence-transformers' `include_prompt: false`); see `pooled_tokens`.
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"

# encode -> pool: whatever the exported graph produces (names are the graph's output names).
LAST_HIDDEN_STATE = "last_hidden_state"  # [tokens, hidden]
TOKEN_WEIGHTS = "token_weights"  # bge-m3: relu(sparse_linear(h)), [tokens]
# bge-m3: colbert_linear(h), [tokens, hidden], CLS row included; a late-interaction model
# (PyLate, ColBERT): its projection of every token, [tokens, dim]
COLBERT_VECS = "colbert_vecs"
LOGITS = "logits"  # sequence classification / rerank, [labels]
# SPLADE: max (or sum) over tokens of log(1 + relu(mlm logits)), [vocab]
SPLADE_WEIGHTS = "splade_weights"
# sentence-transformers' own Pooling and Dense modules run inside the graph (models with Dense
# layers or poolings the pool stage does not compute): [dim], before Normalize.
SENTENCE_EMBEDDING = "sentence_embedding"
# Encoder outputs no ensemble returns: the gateway's token path and a fused model's callers ask for them by name.
ENCODER_ONLY = (LAST_HIDDEN_STATE, SENTENCE_EMBEDDING)

# Ensemble outputs.
DENSE = "dense"  # [dim]
SPARSE_IDS = "sparse_ids"  # int64 [k], ascending, padded with -1 to the request's longest row
SPARSE_WEIGHTS = "sparse_weights"  # fp32 [k], 0 where sparse_ids is -1
# fp32 [tokens, dim]: bge-m3's num_tokens - 1 vectors (CLS dropped), a late-interaction model's
# kept tokens' vectors (`late_kept`) first; zero rows past each row's own vectors
COLBERT = "colbert"
NUM_TOKENS = "num_tokens"  # int32 [1], tokens after truncation, special tokens included
SCORES = "scores"  # fp32 [labels], sigmoid (one label) or softmax (several) of the logits

SPARSE_PAD_ID = -1

# What clients ask for by name (bge-m3's `outputs`, a corpus run's kinds), and the ensemble outputs each is.
OUTPUT_KINDS: dict[str, tuple[str, ...]] = {
    "dense": (DENSE,),
    "sparse": (SPARSE_IDS, SPARSE_WEIGHTS),
    "colbert": (COLBERT,),
}

# The encode stage starts a new sub-batch when a row is this many times longer than the shortest:
# the repository generator's default, and the stage's own where a config names none.
DEFAULT_LENGTH_RATIO = 1.25
# Rows per Triton batch (and per client request), which a TensorRT engine's profile must accept,
# and the token budget of one encoder forward pass (rows x padded length).
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_BATCH_TOKENS = 16384
# The encode stage on CUDA pads each forward pass to a (rows, length) bucket and cuts only on this
# token budget (rows x bucket length) and on the row limit: a GPU pays little for padding until it
# is compute-bound, and a few fixed shapes stay warm. Length buckets are powers of two from
# GPU_SMALLEST_LENGTH_BUCKET below the model's max length, then the max length itself; where the
# stage is not told the max length they stop at GPU_UNTOLD_MAX_BUCKET and longer rows keep their
# own width (a bucket past the model's positions would not run).
DEFAULT_GPU_MAX_BATCH_TOKENS = 131072
GPU_SMALLEST_LENGTH_BUCKET = 32
GPU_UNTOLD_MAX_BUCKET = 512
# A native container's encoder (onnxruntime's CUDA or TensorRT backend, with no packed graph to
# skip padding) pads to the same ladder from a smaller bucket: it computes every padded token.
NATIVE_SMALLEST_LENGTH_BUCKET = 16
# What one GPU pass costs besides its tokens, in tokens' worth of compute: the GPU policy cuts a
# pass in two only where that saves more padding than this. An eager pass of bge-m3's 24 layers
# launches its kernels in about 12 ms, what some 8,000 tokens cost on an H200 (docs/gpu.md).
DEFAULT_GPU_PASS_OVERHEAD_TOKENS = 8192
# The same pass replayed from a CUDA graph launches in about 1.5 ms.
DEFAULT_GPU_GRAPH_OVERHEAD_TOKENS = 1024
# The packed graph's passes (`prensa.export.formats.packing`): real tokens per pass, padding not
# counted.
DEFAULT_PACKED_MAX_TOKENS = 65536
# CUDA graphs are captured for the GPU shapes of at most this many tokens (rows x width): queries
# and small batches, where the launches cost more than the compute.
DEFAULT_CUDA_GRAPH_MAX_TOKENS = 8192
# Rows the encode stage on CUDA may take in one `execute` (its Triton max_batch_size): the passes
# it plans are only as good as the window of rows it sees.
GPU_WINDOW_ROWS = 1024


class TensorType(NamedTuple):
    """A tensor's data type as a config.pbtxt spells it, and the numpy dtype stage code builds it with."""

    triton: str
    numpy: Any


STRING = TensorType("TYPE_STRING", np.object_)
INT64 = TensorType("TYPE_INT64", np.int64)
INT32 = TensorType("TYPE_INT32", np.int32)
FP32 = TensorType("TYPE_FP32", np.float32)

# The type of each named tensor above that crosses a stage boundary or reaches clients.
TENSOR_TYPES: dict[str, TensorType] = {
    TEXT: STRING,
    TEXT_PAIR: STRING,
    INPUT_IDS: INT64,
    ATTENTION_MASK: INT64,
    TOKEN_TYPE_IDS: INT64,
    DENSE: FP32,
    SPARSE_IDS: INT64,
    SPARSE_WEIGHTS: FP32,
    COLBERT: FP32,
    NUM_TOKENS: INT32,
    LOGITS: FP32,
    SCORES: FP32,
}
# Every output of the exported graph (the names its manifest lists), as configs declare them.
ENCODER_OUTPUT_TYPE = FP32


def triton_type(name: str) -> str:
    """The config.pbtxt data type of the named contract tensor."""
    return TENSOR_TYPES[name].triton


def pad_values(pad_id: int) -> dict[str, int]:
    """What each token tensor holds past a row's end: `pad_id`, mask 0, segment 0."""
    return {INPUT_IDS: pad_id, ATTENTION_MASK: 0, TOKEN_TYPE_IDS: 0}


def token_arrays(rows: int, width: int, pad_id: int) -> dict[str, npt.NDArray[Any]]:
    """The three token tensors for `rows` rows of `width` tokens, all padding: callers fill each row's start."""
    return {
        name: np.full((rows, width), value, dtype=TENSOR_TYPES[name].numpy)
        for name, value in pad_values(pad_id).items()
    }


def pad_token_rows(
    ids: Sequence[Sequence[int]],
    type_ids: Sequence[Sequence[int]],
    pad_id: int,
    width: int | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Token rows right-padded to `width` (default: the longest row), as the tokenize stage sends them."""
    arrays = token_arrays(
        len(ids), max((len(row) for row in ids), default=0) if width is None else width, pad_id
    )
    for row, (tokens, types) in enumerate(zip(ids, type_ids)):
        arrays[INPUT_IDS][row, : len(tokens)] = tokens
        arrays[ATTENTION_MASK][row, : len(tokens)] = 1
        arrays[TOKEN_TYPE_IDS][row, : len(tokens)] = types
    return arrays


# How a (query, document) pair is cut to the model's max length: the tokenize stage's
# `pair_truncation` parameter, an export's manifest field, and the gateway's token path.
# LONGEST_FIRST: the longer text loses tokens first, so both keep some (tokenizers' LongestFirst:
# TEI, sentence-transformers' CrossEncoder, transformers' `truncation=True`).
# CAPPED_QUERY: the query keeps at most 3/4 of the max length, the document the rest
# (FlagEmbedding's FlagReranker, bge-reranker's own library).
LONGEST_FIRST = "longest_first"
CAPPED_QUERY = "capped_query"
PAIR_TRUNCATIONS = (LONGEST_FIRST, CAPPED_QUERY)


def query_cap(max_length: int) -> int:
    """The content tokens CAPPED_QUERY leaves a query: FlagReranker's default `query_max_length`."""
    return max_length * 3 // 4


def pair_lengths(first: int, second: int, room: int, rule: str, max_length: int) -> tuple[int, int]:
    """The content tokens a pair of `first` and `second` tokens keeps of each when `room` fit beside
    the special tokens of a `max_length` window, under `rule` (see PAIR_TRUNCATIONS). Lengths only:
    which end is cut is the truncation direction's."""
    if rule == CAPPED_QUERY:
        kept = min(first, query_cap(max_length))
        return kept, max(min(second, room - kept), 0)
    if rule != LONGEST_FIRST:
        raise ValueError(f"unknown pair truncation {rule!r}; one of {', '.join(PAIR_TRUNCATIONS)}")
    if first + second <= room:
        return first, second
    # as tokenizers does it: the shorter text stays whole while it leaves the longer as much room,
    # else both get half the room (the longer, or the second of two equal, the odd token)
    shorter, longer = sorted((first, second))
    longer = shorter if shorter > room else max(shorter, room - shorter)
    if shorter + longer > room:
        shorter, longer = room // 2, room - room // 2
    first_keeps, second_keeps = (longer, shorter) if first > second else (shorter, longer)
    return min(first, first_keeps), min(second, second_keeps)


# How a model's reference library reads a text before tokenizing it: the tokenize stage's
# `strip_texts` parameter ("true" or "false"), an export's manifest field, and the gateway's token
# path. PyLate strips each text (sentence-transformers 5.3's `Transformer.tokenize`, which it pins);
# sentence-transformers 5.4 and later, CrossEncoder, FlagEmbedding, transformers and TEI do not. A
# byte-level tokenizer keeps whitespace as tokens, so only the reference's own rule gives its vectors.
STRIP_TEXTS = "strip_texts"


def read_text(text: str, strip: bool) -> str:
    """`text` as the model's reference library hands it to the tokenizer (see STRIP_TEXTS)."""
    return text.strip() if strip else text


def strips_texts(params: dict[str, str]) -> bool:
    """Whether a stage's config parameters say its model strips texts (STRIP_TEXTS)."""
    return params.get(STRIP_TEXTS, "false") == "true"


PROMPT_TOKEN = 2
# A late-interaction query's expansion token ([MASK] padding to the query length): the encoder reads
# it and computes its vector, but no token attends to it (PyLate's `attend_to_expansion_tokens`
# false). A mask value of its own, so that every stage keeps the token in the row.
UNATTENDED_TOKEN = 3


def attended_tokens(mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Where the encoder attends: every real token, prompt tokens included."""
    return np.greater(mask, 0)


def late_kept(
    ids: npt.NDArray[Any], mask: npt.NDArray[Any], query_marker: int, skiplist: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    """The tokens whose vectors a late-interaction model keeps, as PyLate keeps them: a query's (its
    row has `query_marker` second) every token, expansion included; a document's its real tokens but
    those in `skiplist` (punctuation)."""
    real = np.greater(mask, 0)
    query = ids[:, 1:2] == query_marker if ids.shape[1] > 1 else np.zeros((ids.shape[0], 1), bool)
    return np.asarray(real & (query | ~np.isin(ids, skiplist)))


def pooled_tokens(mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Where pooling reads: real tokens that are not a left-out prompt's."""
    return np.equal(mask, 1)


def token_counts(mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Real tokens per row, prompt tokens included: [rows]."""
    return np.asarray(np.count_nonzero(mask, axis=1))


def mark_prompts(mask: npt.NDArray[Any], prompt_tokens: Sequence[int]) -> npt.NDArray[Any]:
    """`mask` with each right-padded row's first `prompt_tokens[row]` real tokens set to
    PROMPT_TOKEN, as sentence-transformers leaves a prompt out of a pooling that excludes it."""
    if not any(prompt_tokens):
        return mask
    columns = np.arange(mask.shape[1])[None, :]
    prompt = (columns < np.asarray(prompt_tokens, dtype=np.int64)[:, None]) & (mask > 0)
    return np.where(prompt, PROMPT_TOKEN, mask).astype(mask.dtype)


def parameters(model_config: dict[str, Any] | str) -> dict[str, str]:
    """The `parameters { key value { string_value } }` map of a model config, as plain strings."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def int_list(text: str) -> list[int]:
    """Parse a comma-separated list of ints as written by the repository generator."""
    return [int(item) for item in text.split(",") if item.strip()]


def gpu_length_buckets(
    max_length: int | None, smallest: int = GPU_SMALLEST_LENGTH_BUCKET
) -> tuple[int, ...]:
    """Powers of two from `smallest` below `max_length`, then `max_length`; without a max length,
    powers of two up to GPU_UNTOLD_MAX_BUCKET (longer rows keep their own width). The one ladder of
    GPU length buckets: the encode stage's (from GPU_SMALLEST_LENGTH_BUCKET) and the native
    containers' (from NATIVE_SMALLEST_LENGTH_BUCKET, `prensa.triton.native`)."""
    top = GPU_UNTOLD_MAX_BUCKET if max_length is None else max_length
    powers = [
        2**k
        for k in range(max(smallest, 1).bit_length() - 1, top.bit_length())
        if smallest <= 2**k < top
    ]
    return (*powers, top)


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two below `max_rows`, then `max_rows`."""
    return (*(2**k for k in range(max_rows.bit_length()) if 2**k < max_rows), max(max_rows, 1))


# A request Triton marks cancelled (its gRPC client hung up) is answered with this, not computed.
CANCELLED_MESSAGE = "the request was cancelled: its client is gone"
# How often, at most, a stage asks Triton again whether one request is cancelled while it computes
# others: each question is a round trip to the Triton process.
CANCEL_CHECK_INTERVAL_S = 0.05


class Cancelled(Exception):
    """A request skipped because Triton marked it cancelled: answered with `cancelled_response`."""


class CancelCheck:
    """Whether Triton has marked a request of one `execute` cancelled, asking it at most once per
    `interval_s` per request (a True answer is kept: a cancelled request stays cancelled).

    Triton's dynamic batcher drops a request cancelled while it waits in the queue, but not one
    already in a batch handed to the stage (the next batch is formed while the current one runs),
    and an ensemble marks only the steps it creates after the cancellation, never a step already
    queued. So stages ask at the start of `execute` and between sub-batches."""

    def __init__(
        self,
        requests: Sequence[Any],
        interval_s: float = CANCEL_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests = requests
        self.interval_s = interval_s
        self.clock = clock
        self.cancelled: set[int] = set()
        self.asked_at: dict[int, float] = {}

    def live(self) -> list[int]:
        """The indexes of the requests not cancelled now: what an `execute` starts computing."""
        return [index for index in range(len(self.requests)) if not self(index)]

    def __call__(self, index: int) -> bool:
        if index in self.cancelled:
            return True
        now = self.clock()
        asked = self.asked_at.get(index)
        if asked is not None and now - asked < self.interval_s:
            return False
        self.asked_at[index] = now
        try:
            cancelled: bool = self.requests[index].is_cancelled()
        except Exception:  # noqa: BLE001 - a failed question must not fail the batch: compute it
            return False
        if cancelled:
            self.cancelled.add(index)
        return cancelled


def cancelled_response() -> Any:
    """The answer to a cancelled request: Triton's CANCELLED status, as its own batcher gives."""
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(CANCELLED_MESSAGE, pb_utils.TritonError.CANCELLED)
    )
