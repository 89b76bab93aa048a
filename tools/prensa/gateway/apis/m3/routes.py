"""bge-m3 beyond TEI: every output from one Triton call (`/embed_m3`, and `/embed` with
`outputs`), and hybrid relevance scores computed in the gateway (`/score`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Response

from prensa.gateway.apis.common import activated, cut_side
from prensa.gateway.apis.dialects import (
    VLLM_FIRST_TEXTS,
    VLLM_SECOND_TEXTS,
    Dialect,
    dialect_of,
    given_fields,
)
from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.m3.answers import OUTPUT_TENSORS, embed_m3_payload
from prensa.gateway.apis.m3.protocol import (
    HybridScore,
    M3Embedding,
    M3Request,
    ScoreRequest,
    VllmScores,
)
from prensa.gateway.core import hybrid
from prensa.gateway.core.asks import ColbertAsk, DenseAsk, M3Ask, ScoresAsk
from prensa.gateway.core.engine import gather
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import Capability, ServedModel, named_model
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import Truncation
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.http.routing import CountedRoute, GatewayRequest, ModelParam, json_response
from prensa.gateway.state import Gateway
from prensa.manifest import Task

router = APIRouter(route_class=CountedRoute, responses=TEI_ERRORS, tags=["bge-m3"])


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


def one_of(request: ScoreRequest, names: tuple[str, ...]) -> str | list[str] | None:
    """The one field of `names` the body gives; two are refused."""
    given = [name for name in names if getattr(request, name) is not None]
    if len(given) > 1:
        raise validation(
            f"{' and '.join(f'`{name}`' for name in given)} are names for the same field: give one"
        )
    return getattr(request, given[0]) if given else None


def score_pairs(request: ScoreRequest) -> tuple[list[str], list[str]]:
    """vLLM's pairs: one first text for every second one, or one each."""
    if request.query is not None or request.passages is not None or request.weights is not None:
        raise validation(
            "give bge-m3's `query` and `passages` (with `weights`) or vLLM's `text_1` and `text_2`, "
            "not both"
        )
    first, second = one_of(request, VLLM_FIRST_TEXTS), one_of(request, VLLM_SECOND_TEXTS)
    if first is None or second is None:
        raise validation(
            "`text_1` and `text_2` are both required (or `queries` with `documents` or `items`, "
            "or `data_1` and `data_2`)"
        )
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


def score_truncation(request: ScoreRequest, gw: Gateway, served: ServedModel) -> Truncation:
    """TEI's `truncate` or vLLM's `truncate_prompt_tokens` (over each pair for a reranker)."""
    direction = cut_side(
        request, request.truncation_direction, "truncation_direction" in request.model_fields_set
    )
    return gw.service.windowed(
        served,
        truncate=request.truncate,
        direction=direction,
        window=request.truncate_prompt_tokens,
        pairs=served.task is Task.RERANK,
    )


async def vllm_scores(
    request: ScoreRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> dict[str, Any]:
    """vLLM's `/score`: a reranker's sigmoid scores of the pairs, a late-interaction model's MaxSim
    of each first text as a query against its second, or an embedder's cosine similarity; the last
    two have no activation, so `use_activation: false` leaves them as they are (as vLLM serves it)."""
    lefts, rights = score_pairs(request)
    truncation = score_truncation(request, gw, served)
    raw = not activated(None, request)
    if served.task is Task.RERANK:
        scored = await gw.service.run(
            ScoresAsk(
                model=served,
                items=list(lefts),
                pairs=rights,
                truncation=truncation,
                raw_scores=raw,
            ),
            context,
        )
        scores, used = scored.values[:, 0], int(scored.num_tokens.sum())
    elif served.task is Task.LATE:
        queries, documents = list(dict.fromkeys(lefts)), list(dict.fromkeys(rights))
        asked, found = await gather(
            [
                gw.service.run(
                    ColbertAsk(
                        model=served, items=list(queries), truncation=truncation, query=True
                    ),
                    context,
                ),
                gw.service.run(
                    ColbertAsk(model=served, items=list(documents), truncation=truncation), context
                ),
            ]
        )
        query_vectors = dict(zip(queries, asked.rows))
        document_vectors = dict(zip(documents, found.rows))
        scores = np.asarray(
            [
                hybrid.late_score(query_vectors[a], document_vectors[b])
                for a, b in zip(lefts, rights)
            ]
        )
        used = int(asked.num_tokens.sum() + found.num_tokens.sum())
    elif served.can(Capability.DENSE):
        unique = list(dict.fromkeys([*lefts, *rights]))
        result = await gw.service.run(
            DenseAsk(
                model=served,
                items=prompted(served, gw.settings, list(unique)),
                truncation=truncation,
            ),
            context,
        )
        vectors = dict(zip(unique, result.rows))
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


SCORE_PATH = "/score"


@router.post(
    SCORE_PATH,
    response_model=list[HybridScore] | VllmScores,
    summary="bge-m3 hybrid relevance scores (or vLLM's pair scores, by the body)",
)
async def score(request: ScoreRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """Dense, sparse, ColBERT and their weighted means for each passage against the query, as
    FlagEmbedding's `BGEM3FlagModel.compute_score`; query and passages are encoded in one call.
    A body with vLLM's `text_1`/`text_2` (or its other names) gets vLLM's `/score` instead."""
    gw, context = http.gateway, http.context
    if dialect_of(SCORE_PATH, given_fields(request)) is Dialect.VLLM:
        served = await gw.registry.pick(None, named_model(model, request.model))
        return json_response(await vllm_scores(request, gw, served, context), context)
    served = await gw.registry.pick(Capability.M3, named_model(model, request.model))
    if request.query is None or request.passages is None:
        raise validation(
            "`query` and `passages` are both required (or vLLM's `text_1` and `text_2`)"
        )
    if not request.passages:
        raise GatewayError(ErrorKind.EMPTY, "`passages` cannot be empty")
    if request.use_activation is not None or request.activation is not None:
        raise validation("bge-m3's hybrid scores have no activation (`use_activation`)")
    rows = await gw.service.run(
        M3Ask(
            model=served,
            items=[request.query, *request.passages],
            truncation=score_truncation(request, gw, served),
            wanted=frozenset().union(*OUTPUT_TENSORS.values()),
        ),
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
