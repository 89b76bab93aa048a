"""OpenAI-compatible `/v1/embeddings` (also at `/embeddings`, as TEI; NIM's `input_type` and
`truncate` too) and `/v1/models`, which SDKs and LiteLLM health checks read (HTTP only). Errors on
these routes use OpenAI's `{"message","code","type"}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from prensa.gateway.errors import ROUTE_ERROR_STATUSES
from prensa.gateway.models import Capability, ServedModel, named_model
from prensa.gateway.prompts import prompted
from prensa.gateway.protocol_openai import (
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    OpenAIError,
)
from prensa.gateway.quantize import base64_float32
from prensa.gateway.responses import CountedRoute, GatewayRequest, GatewayRoute, ModelParam, json_response
from prensa.gateway.tokenization import Truncation, as_items

ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": OpenAIError} for status in ROUTE_ERROR_STATUSES}
router = APIRouter(route_class=CountedRoute, responses=ERRORS, tags=["OpenAI"])
models_router = APIRouter(route_class=GatewayRoute, responses=ERRORS, tags=["OpenAI"])
# NIM's and Cohere's `truncate`, as the gateway's truncation; None leaves it to --auto-truncate.
TRUNCATE_ENDS = {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right")}


def truncation_of(truncate: str | None, auto_truncate: bool) -> Truncation:
    enabled, direction = TRUNCATE_ENDS[truncate] if truncate else (auto_truncate, "right")
    return Truncation(enabled, direction)


@router.post("/v1/embeddings", response_model=EmbeddingResponse, summary="OpenAI embeddings")
@router.post("/embeddings", response_model=EmbeddingResponse, include_in_schema=False)
async def openai_embeddings(request: EmbeddingRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """Dense, L2-normalised vectors; right truncation when --auto-truncate is on (the default)."""
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.DENSE, named_model(model, request.model))
    items = prompted(served, gw.settings, as_items(request.input), input_type=request.input_type)
    result = await gw.service.dense(served, items, truncation_of(request.truncate, gw.settings.auto_truncate),
                                    True, request.dimensions, timings, gw.service.chunking(request.chunking))
    encode = base64_float32 if request.encoding_format == "base64" else (lambda row: row)
    tokens = int(result.num_tokens.sum())
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "embedding": encode(row), "index": i,
                  **({"chunks": timings.chunks[i]} if timings.chunks else {})} for i, row in enumerate(result.rows)],
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }, timings)


def model_card(model: ServedModel, created: int) -> dict[str, object]:
    return {"id": model.name, "object": "model", "created": created, "owned_by": "prensa", "root": model.name,
            "task": model.task, "max_model_len": model.max_length}


@models_router.get("/v1/models", response_model=ModelList, summary="Served models (OpenAI's list)")
async def list_models(http: GatewayRequest) -> Response:
    registry = http.gateway.registry
    await registry.ensure()
    created = int(http.gateway.started)
    return json_response({"object": "list", "data": [model_card(m, created) for m in registry.models.values()]})


@models_router.get("/v1/models/{model_id}", response_model=ModelCard, summary="One served model")
async def retrieve_model(model_id: str, http: GatewayRequest) -> Response:
    served = await http.gateway.registry.pick(None, model_id)
    return json_response(model_card(served, int(http.gateway.started)))
