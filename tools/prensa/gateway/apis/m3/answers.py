"""bge-m3's answers as JSON: each input's dense, sparse and ColBERT outputs from one Triton call,
for `/embed_m3` and TEI's `/embed` with `outputs`."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from prensa.gateway.apis.common import asked_chunking
from prensa.gateway.apis.m3.protocol import M3Request
from prensa.gateway.core.asks import M3Ask
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import as_items
from prensa.gateway.errors import validation
from prensa.gateway.state import Gateway
from prensa.stages import contract

OUTPUT_TENSORS = {kind: frozenset(names) for kind, names in contract.OUTPUT_KINDS.items()}
FLOAT_TYPES: dict[str, np.dtype[Any]] = {
    "base64": np.dtype("<f4"),
    "base64_float16": np.dtype("<f2"),
}


def colbert_json(vectors: npt.NDArray[Any], encoding: str) -> Any:
    if encoding == "float":
        return vectors
    packed = np.ascontiguousarray(vectors, dtype=FLOAT_TYPES[encoding])
    return {
        "encoding": encoding,
        "shape": list(vectors.shape),
        "data": base64.b64encode(packed.tobytes()).decode(),
    }


async def embed_m3_payload(
    request: M3Request, gw: Gateway, served: ServedModel, context: RequestContext
) -> list[dict[str, Any]]:
    """What `/embed_m3` answers: each input's asked outputs, in one Triton call per chunk."""
    missing = [name for name in request.outputs if not OUTPUT_TENSORS[name] <= served.outputs]
    if missing:
        raise validation(
            f"model `{served.name}` does not serve {', '.join(missing)} (exported --dense-only?)"
        )
    items = prompted(served, gw.settings, as_items(request.inputs), request.prompt_name)
    wanted = frozenset().union(*(OUTPUT_TENSORS[name] for name in request.outputs))
    rows = await gw.service.run(
        M3Ask(
            model=served,
            items=items,
            truncation=gw.service.truncation(request.truncate, request.truncation_direction),
            wanted=wanted,
            chunking=gw.service.chunking(*asked_chunking(request.chunking)),
        ),
        context,
    )
    tokens: list[list[str]] | None = None
    if request.return_tokens and rows.sparse_ids is not None:
        tokenizer = served.require_tokenizer()
        tokens = [tokenizer.decode_batch([[i] for i in ids.tolist()]) for ids in rows.sparse_ids]
    answers = []
    for i, count in enumerate(rows.num_tokens.tolist()):
        answer: dict[str, Any] = {}
        if rows.dense is not None:
            answer["dense"] = rows.dense[i]
        if rows.sparse_ids is not None and rows.sparse_weights is not None:
            ids, weights = rows.sparse_ids[i].tolist(), rows.sparse_weights[i].tolist()
            answer["sparse"] = [
                {"index": index, "value": value, **({"token": tokens[i][k]} if tokens else {})}
                for k, (index, value) in enumerate(zip(ids, weights))
            ]
        if rows.colbert is not None:
            answer["colbert"] = colbert_json(rows.colbert[i], request.colbert_encoding)
        answer["num_tokens"] = count
        if rows.chunks is not None:
            answer["chunks"] = rows.chunks[i]
        answers.append(answer)
    return answers
