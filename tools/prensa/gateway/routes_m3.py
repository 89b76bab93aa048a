"""bge-m3 beyond TEI: every output from one Triton call (`/embed_m3`, and `/embed` with
`outputs`), and hybrid relevance scores computed in the gateway (`/score`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Response

from prensa.gateway import hybrid
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.m3_answers import OUTPUT_TENSORS, embed_m3_payload
from prensa.gateway.models import Capability, named_model
from prensa.gateway.prompts import prompted
from prensa.gateway.protocol_m3 import HybridScore, M3Embedding, M3Request, ScoreRequest, VllmScores
from prensa.gateway.protocol_tei import ERRORS
from prensa.gateway.request_context import RequestContext
from prensa.gateway.responses import (
    CountedRoute,
    Gateway,
    GatewayRequest,
    ModelParam,
    json_response,
)
from prensa.manifest import Task

router = APIRouter(route_class=CountedRoute, responses=ERRORS, tags=["bge-m3"])


@router.post(
    "/embed_m3",
    response_model=list[M3Embedding],
    response_model_exclude_none=True,
    summary="bge-m3: dense, sparse and ColBERT from one forward pass",
)
async def embed_m3(request: M3Request, http: GatewayRequest, model: ModelParam = None) -> Response:
    """Any subset of `dense`, `sparse` and `colbert` for each input, from one Triton call."""
    gw = http.gateway
    served = await gw.registry.pick(Capability.M3, named_model(model, request.model))
    return json_response(await embed_m3_payload(request, gw, served, http.context), http.context)


def score_pairs(request: ScoreRequest) -> tuple[list[str], list[str]]:
    """vLLM's pairs: one first text for every second one, or one each."""
    if request.query is not None or request.passages is not None or request.weights is not None:
        raise validation(
            "give bge-m3's `query` and `passages` (with `weights`) or vLLM's `text_1` and `text_2`, "
            "not both"
        )
    if (request.text_1 is not None and request.queries is not None) or (
        request.text_2 is not None and request.documents is not None
    ):
        raise validation(
            "`text_1`/`text_2` and `queries`/`documents` are two names for the same fields: give one"
        )
    first, second = (
        request.text_1 if request.text_1 is not None else request.queries,
        (request.text_2 if request.text_2 is not None else request.documents),
    )
    if first is None or second is None:
        raise validation("`text_1` and `text_2` are both required")
    lefts, rights = (
        ([first] if isinstance(first, str) else first),
        ([second] if isinstance(second, str) else second),
    )
    if not lefts or not rights:
        raise GatewayError(ErrorKind.EMPTY, "`text_1` and `text_2` cannot be empty")
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    if len(lefts) != len(rights):
        raise validation(
            f"`text_1` has {len(lefts)} texts and `text_2` {len(rights)}: give one, or as many"
        )
    return lefts, rights


async def vllm_scores(
    request: ScoreRequest, gw: Gateway, name: str | None, context: RequestContext
) -> dict[str, Any]:
    """vLLM's `/score`: a reranker's sigmoid scores of the pairs, or an embedder's cosine similarity."""
    lefts, rights = score_pairs(request)
    served = await gw.registry.pick(None, name)
    truncation = gw.service.truncation(request.truncate, request.truncation_direction)
    if served.task is Task.RERANK:
        values, tokens = await gw.service.scores(served, lefts, rights, truncation, False, context)
        scores, used = values[:, 0], int(tokens.sum())
    elif served.can(Capability.DENSE):
        unique = list(dict.fromkeys([*lefts, *rights]))
        result = await gw.service.dense(
            served, prompted(served, gw.settings, list(unique)), truncation, True, None, context
        )
        vectors = dict(zip(unique, np.asarray(result.rows)))
        scores = np.asarray([float(vectors[a] @ vectors[b]) for a, b in zip(lefts, rights)])
        used = int(result.num_tokens.sum())
    else:
        raise validation(
            f"model `{served.name}` (task {served.task}) scores no pairs: vLLM's `/score` needs a "
            "reranker or an embedder"
        )
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": served.name,
        "data": [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(scores)],
        "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0},
    }


VLLM_FIELDS = ("text_1", "text_2", "queries", "documents")


@router.post(
    "/score",
    response_model=list[HybridScore] | VllmScores,
    summary="bge-m3 hybrid relevance scores (or vLLM's pair scores, by the body)",
)
async def score(request: ScoreRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """Dense, sparse, ColBERT and their weighted means for each passage against the query, as
    FlagEmbedding's `BGEM3FlagModel.compute_score`; query and passages are encoded in one call.
    A body with vLLM's `text_1`/`text_2` (or `queries`/`documents`) gets vLLM's `/score` instead."""
    gw, context = http.gateway, http.context
    if any(getattr(request, field) is not None for field in VLLM_FIELDS):
        return json_response(
            await vllm_scores(request, gw, named_model(model, request.model), context), context
        )
    served = await gw.registry.pick(Capability.M3, named_model(model, request.model))
    if request.query is None or request.passages is None:
        raise validation(
            "`query` and `passages` are both required (or vLLM's `text_1` and `text_2`)"
        )
    if not request.passages:
        raise GatewayError(ErrorKind.EMPTY, "`passages` cannot be empty")
    rows = await gw.service.m3(
        served,
        [request.query, *request.passages],
        gw.service.truncation(request.truncate, request.truncation_direction),
        frozenset().union(*OUTPUT_TENSORS.values()),
        context,
    )
    try:
        modes = hybrid.scores(rows, request.weights or hybrid.DEFAULT_WEIGHTS)
    except ValueError as exc:
        raise validation(str(exc)) from None
    return json_response(
        [
            {"index": i, **{mode: values[i] for mode, values in modes.items()}}
            for i in range(len(request.passages))
        ],
        context,
    )
