"""Pool stage: encoder outputs -> what clients receive.

Pure numpy functions on top (unit-tested against FlagEmbedding, sentence-transformers and
transformers), a thin Triton model at the bottom. Which outputs a request gets depends on which
encoder outputs the ensemble wires in; a graph that pools itself (`sentence_embedding`) is only
normalised here. Config parameters: `pooling` (cls|mean|last),
`normalize` (true|false), `drop_ids` (token ids never reported as sparse terms), `activation`
(sigmoid|softmax, for logits), and for late-interaction models `query_marker_id` and
`skiplist_ids` (see `contract.late_kept`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import prensa_stage as contract

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by unit tests of the functions above the model
    pb_utils = None


def l2_normalize(x: npt.NDArray[Any], eps: float = 1e-12) -> npt.NDArray[Any]:
    """torch.nn.functional.normalize semantics: an all-zero vector stays zero."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return cast(npt.NDArray[Any], x / np.maximum(norm, eps))


def pool_tokens(hidden: npt.NDArray[Any], mask: npt.NDArray[Any], mode: str) -> npt.NDArray[Any]:
    """[rows, tokens, dim] -> [rows, dim] over the tokens pooling reads (`contract.pooled_tokens`):
    cls takes the first of them and last the last, as sentence-transformers does when a prompt is
    left out; a row with none pools to zeros."""
    pooled = contract.pooled_tokens(mask)
    rows = np.arange(hidden.shape[0])
    if mode == "cls":
        return cast(npt.NDArray[Any], hidden[rows, pooled.argmax(axis=1)])
    if mode == "mean":
        weights = pooled[..., None].astype(hidden.dtype)
        return cast(
            npt.NDArray[Any], (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        )
    if mode == "last":
        last = hidden.shape[1] - 1 - pooled[:, ::-1].argmax(axis=1)
        return cast(npt.NDArray[Any], hidden[rows, last] * pooled[rows, last][:, None])
    raise ValueError(f"unknown pooling {mode!r}")


def dense_vectors(
    hidden: npt.NDArray[Any], mask: npt.NDArray[Any], pooling: str, normalize: bool
) -> npt.NDArray[Any]:
    """The `dense` output clients receive: pooled, then L2-normalised when the model normalises."""
    dense = pool_tokens(hidden, mask, pooling)
    return l2_normalize(dense) if normalize else dense


def sparse_terms(
    ids: npt.NDArray[Any], weights: npt.NDArray[Any], drop_ids: npt.NDArray[Any]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Max weight per token id over one row, ascending ids, dropped ids and weights <= 0 removed."""
    keep = (weights > 0) & ~np.isin(ids, drop_ids)
    unique, inverse = np.unique(ids[keep], return_inverse=True)
    best = np.zeros(unique.shape[0], dtype=np.float32)
    np.maximum.at(best, inverse, weights[keep].astype(np.float32))
    return unique.astype(np.int64), best


def vocab_terms(weights: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """A dense vocabulary-sized weight vector -> its non-zero (id, weight) pairs."""
    ids = np.flatnonzero(weights > 0)
    return ids.astype(np.int64), weights[ids].astype(np.float32)


def pad_terms(
    rows: list[tuple[npt.NDArray[Any], npt.NDArray[Any]]],
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Per-row (ids, weights) -> [rows, k] tensors padded with id -1 and weight 0."""
    width = max((ids.shape[0] for ids, _ in rows), default=0)
    ids_out = np.full((len(rows), width), contract.SPARSE_PAD_ID, dtype=np.int64)
    weights_out = np.zeros((len(rows), width), dtype=np.float32)
    for i, (ids, weights) in enumerate(rows):
        ids_out[i, : ids.shape[0]] = ids
        weights_out[i, : weights.shape[0]] = weights
    return ids_out, weights_out


def colbert_vectors(vecs: npt.NDArray[Any], mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """bge-m3 multi-vectors: drop CLS, zero padding, L2-normalise per token -> [rows, tokens-1, dim]."""
    return l2_normalize(vecs[:, 1:] * mask[:, 1:, None].astype(vecs.dtype))


def late_vectors(
    vecs: npt.NDArray[Any], ids: npt.NDArray[Any], mask: npt.NDArray[Any], late: LateTokens
) -> npt.NDArray[Any]:
    """A late-interaction model's multi-vectors: each row's kept tokens (`contract.late_kept`)
    L2-normalised and moved to the front, in order, zero rows after them."""
    kept = contract.late_kept(ids, mask, late.query_marker, late.skiplist)
    out = np.zeros(vecs.shape, dtype=np.float32)
    for row in range(vecs.shape[0]):
        chosen = vecs[row, kept[row]]
        out[row, : chosen.shape[0]] = l2_normalize(chosen)
    return out


def activate(logits: npt.NDArray[Any], activation: str) -> npt.NDArray[Any]:
    if activation == "sigmoid":
        return cast(npt.NDArray[Any], 1.0 / (1.0 + np.exp(-logits)))
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return cast(npt.NDArray[Any], shifted / shifted.sum(axis=-1, keepdims=True))
    raise ValueError(f"unknown activation {activation!r}")


def pool_request(
    tensors: dict[str, npt.NDArray[Any]],
    pooling: str,
    normalize: bool,
    drop_ids: npt.NDArray[Any],
    activation: str,
    late: LateTokens | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """All client-facing outputs for one request, from whatever encoder outputs it carries; `late`
    for a late-interaction model, whose `colbert_vecs` are its per-token projections."""
    mask = tensors[contract.ATTENTION_MASK]
    out = {contract.NUM_TOKENS: contract.token_counts(mask)[:, None].astype(np.int32)}
    if contract.SENTENCE_EMBEDDING in tensors:
        pooled = tensors[contract.SENTENCE_EMBEDDING]
        out[contract.DENSE] = l2_normalize(pooled) if normalize else pooled
    elif contract.LAST_HIDDEN_STATE in tensors:
        out[contract.DENSE] = dense_vectors(
            tensors[contract.LAST_HIDDEN_STATE], mask, pooling, normalize
        )
    if contract.TOKEN_WEIGHTS in tensors:
        ids, weights = (
            tensors[contract.INPUT_IDS],
            tensors[contract.TOKEN_WEIGHTS] * contract.attended_tokens(mask),
        )
        out[contract.SPARSE_IDS], out[contract.SPARSE_WEIGHTS] = pad_terms(
            [sparse_terms(ids[i], weights[i], drop_ids) for i in range(ids.shape[0])]
        )
    if contract.SPLADE_WEIGHTS in tensors:
        out[contract.SPARSE_IDS], out[contract.SPARSE_WEIGHTS] = pad_terms(
            [vocab_terms(row) for row in tensors[contract.SPLADE_WEIGHTS]]
        )
    if contract.COLBERT_VECS in tensors and late is not None:
        out[contract.COLBERT] = late_vectors(
            tensors[contract.COLBERT_VECS], tensors[contract.INPUT_IDS], mask, late
        )
    elif contract.COLBERT_VECS in tensors:
        out[contract.COLBERT] = colbert_vectors(
            tensors[contract.COLBERT_VECS], contract.attended_tokens(mask)
        )
    if contract.LOGITS in tensors:
        out[contract.LOGITS] = tensors[contract.LOGITS]
        out[contract.SCORES] = activate(tensors[contract.LOGITS], activation)
    return {
        name: value.astype(np.float32) if value.dtype == np.float64 else value
        for name, value in out.items()
    }


ENCODER_OUTPUTS = (
    contract.LAST_HIDDEN_STATE,
    contract.SENTENCE_EMBEDDING,
    contract.TOKEN_WEIGHTS,
    contract.COLBERT_VECS,
    contract.LOGITS,
    contract.SPLADE_WEIGHTS,
)


@dataclass(frozen=True)
class LateTokens:
    """Which tokens' vectors a late-interaction model keeps (`contract.late_kept`)."""

    query_marker: int
    skiplist: npt.NDArray[Any]

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> LateTokens | None:
        if "query_marker_id" not in params:
            return None
        skiplist = np.asarray(contract.int_list(params.get("skiplist_ids", "")), dtype=np.int64)
        return cls(int(params["query_marker_id"]), skiplist)


@dataclass(frozen=True)
class Pooler:
    """`pool_request` with the settings of one model config."""

    pooling: str
    normalize: bool
    drop_ids: npt.NDArray[Any]
    activation: str
    late: LateTokens | None = None

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> Pooler:
        return cls(
            params.get("pooling", "cls"),
            params.get("normalize", "true") == "true",
            np.asarray(contract.int_list(params.get("drop_ids", "")), dtype=np.int64),
            params.get("activation", "sigmoid"),
            LateTokens.from_parameters(params),
        )

    def __call__(self, tensors: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        return pool_request(
            tensors, self.pooling, self.normalize, self.drop_ids, self.activation, self.late
        )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.pool = Pooler.from_parameters(contract.parameters(args["model_config"]))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:  # pooled one by one: a request that raises fails alone
            tensors: dict[str, npt.NDArray[Any]] = {}
            for name in (contract.INPUT_IDS, contract.ATTENTION_MASK, *ENCODER_OUTPUTS):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    tensors[name] = tensor.as_numpy()
            try:
                outputs = self.pool(tensors)
            except Exception as exc:  # noqa: BLE001 - e.g. inputs whose shapes disagree
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"pooling failed: {exc}"))
                )
                continue
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])
            )
        return responses
