"""bge-m3 beyond TEI: every output from one Triton call (`/embed_m3`, and `/embed` with
`outputs`), and hybrid relevance scores computed in the gateway (`/score`'s bge-m3 body, which
`apis.shared` routes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from prensa.gateway.apis.common import activated, cut_side
from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.m3.answers import OUTPUT_TENSORS, embed_m3_payload
from prensa.gateway.apis.m3.protocol import M3Embedding, M3Request, ScoreRequest
from prensa.gateway.apis.operation import Operation
from prensa.gateway.core import hybrid
from prensa.gateway.core.asks import M3Ask
from prensa.gateway.core.registry import ServedModel, named_model
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import Truncation
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.http.routing import CountedRoute, GatewayRequest, ModelParam, json_response
from prensa.gateway.state import Gateway
from prensa.layouts import Capability

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


def score_truncation(request: ScoreRequest, gw: Gateway, served: ServedModel) -> Truncation:
    """TEI's `truncate` and direction, or vLLM's `truncate_prompt_tokens` and `truncation_side`."""
    direction = cut_side(
        request, request.truncation_direction, "truncation_direction" in request.model_fields_set
    )
    return gw.service.windowed(
        served,
        truncate=request.truncate,
        direction=direction,
        window=request.truncate_prompt_tokens,
    )


async def _score(
    request: ScoreRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """Dense, sparse, ColBERT and their weighted means for each passage against the query, as
    FlagEmbedding's `BGEM3FlagModel.compute_score`; query and passages are encoded in one call.
    The scores have no activation: `use_activation` leaves them as they are."""
    if not request.passages:
        raise GatewayError(ErrorKind.EMPTY, "`passages` cannot be empty")
    activated(None, request)  # the two names that disagree are refused, as on every route
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
    return [
        {"index": i, **{mode: values[i] for mode, values in modes.items()}}
        for i in range(len(request.passages))
    ]


SCORE = Operation("score", ScoreRequest, Capability.M3, _score)
