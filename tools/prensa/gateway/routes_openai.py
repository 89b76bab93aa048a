"""OpenAI-compatible `/v1/embeddings` (also at `/embeddings`, as TEI) and a Cohere/Jina-style
`/v1/rerank` (HTTP only). Errors on these routes use OpenAI's `{"message","code","type"}`."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Response

from prensa.gateway.models import Capability
from prensa.gateway.protocol_openai import (
    EmbeddingRequest,
    EmbeddingResponse,
    OpenAIError,
    RerankDocument,
    RerankRequest,
    RerankResponse,
)
from prensa.gateway.responses import CountedRoute, GatewayRequest, json_response
from prensa.gateway.tokenization import Truncation, as_items

ERRORS = {status: {"model": OpenAIError} for status in (400, 404, 413, 422, 424, 429, 503)}
router = APIRouter(route_class=CountedRoute, responses=ERRORS, tags=["OpenAI"])


def encode_base64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


@router.post("/v1/embeddings", response_model=EmbeddingResponse, summary="OpenAI embeddings")
@router.post("/embeddings", response_model=EmbeddingResponse, include_in_schema=False)
async def openai_embeddings(request: EmbeddingRequest, http: GatewayRequest) -> Response:
    """Dense, L2-normalised vectors; right truncation when --auto-truncate is on (the default)."""
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.DENSE, request.model)
    result = await gw.service.dense(served, as_items(request.input), Truncation(gw.settings.auto_truncate, "right"),
                                    True, request.dimensions, timings)
    encode = encode_base64 if request.encoding_format == "base64" else (lambda row: row)
    tokens = int(result.num_tokens.sum())
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "embedding": encode(row), "index": i} for i, row in enumerate(result.rows)],
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }, timings)


@router.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True, summary="Rerank documents")
async def openai_rerank(request: RerankRequest, http: GatewayRequest) -> Response:
    """Cohere/Jina request shape; `relevance_score` is the sigmoid of the cross-encoder logit."""
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.RERANK, request.model)
    texts = [d.text if isinstance(d, RerankDocument) else d for d in request.documents]
    values, tokens = await gw.service.scores(served, [request.query] * len(texts), list(texts),
                                             Truncation(gw.settings.auto_truncate, "right"), False, timings)
    order = np.argsort(-values[:, 0], kind="stable").tolist()[: request.top_n]
    results = []
    for index in order:
        result = {"index": index, "relevance_score": float(values[index, 0])}
        if request.return_documents:
            result["document"] = {"text": texts[index]}
        results.append(result)
    total = int(tokens.sum())
    return json_response({"model": served.name, "results": results,
                          "usage": {"prompt_tokens": total, "total_tokens": total}}, timings)
