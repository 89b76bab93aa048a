"""NVIDIA NIM's text reranking, `/v1/ranking` (HTTP only); NIM's embeddings are `/v1/embeddings`
with `input_type` and `truncate` (see `apis.openai.routes`)."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Response

from prensa.gateway.apis.common import truncate_end
from prensa.gateway.apis.errors import MESSAGE_ERRORS
from prensa.gateway.apis.nim.protocol import RankingRequest, RankingResponse
from prensa.gateway.core.asks import RelevanceAsk
from prensa.gateway.core.registry import named_model
from prensa.gateway.http.routing import CountedRoute, GatewayRequest, ModelParam, json_response
from prensa.layouts import Capability

router = APIRouter(route_class=CountedRoute, responses=MESSAGE_ERRORS, tags=["NIM"])


@router.post("/v1/ranking", response_model=RankingResponse, summary="Rerank passages (NVIDIA NIM)")
async def nim_ranking(
    request: RankingRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Raw cross-encoder logits, best first."""
    gw, context = http.gateway, http.context
    served = await gw.registry.pick(Capability.RERANK, named_model(model, request.model))
    passages = [p.text for p in request.passages]
    scored = await gw.service.relevance(
        RelevanceAsk(
            model=served,
            query=request.query.text,
            texts=passages,
            truncation=gw.service.truncation(*truncate_end(request.truncate)),
            raw_scores=True,
        ),
        context,
    )
    logits = scored.values
    return json_response(
        {
            "rankings": [
                {"index": i, "logit": float(logits[i])}
                for i in np.argsort(-logits, kind="stable").tolist()
            ]
        },
        context,
    )
