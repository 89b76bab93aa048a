"""Ollama's embedding API: `/api/embed` (L2-normalised vectors, Matryoshka `dimensions`,
`truncate`), the older `/api/embeddings` (one text, not normalised), and `/api/tags` and
`/api/show`, which the `ollama` client and langchain-ollama read to find a model. Ollama names
models `name:tag`: a `:latest` tag names the served model itself. Errors keep TEI's body, whose
`error` field is what Ollama's clients read."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response

from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.ollama.protocol import (
    OllamaEmbeddingsRequest,
    OllamaEmbeddingsResponse,
    OllamaEmbedRequest,
    OllamaEmbedResponse,
    OllamaShow,
    OllamaShowRequest,
    OllamaTags,
)
from prensa.gateway.core.asks import DenseAsk
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel, named_model
from prensa.gateway.core.tokenization import Item, Truncation
from prensa.gateway.errors import validation
from prensa.gateway.http.routing import (
    CountedRoute,
    GatewayRequest,
    GatewayRoute,
    ModelParam,
    json_response,
)
from prensa.gateway.state import Gateway
from prensa.layouts import Capability

router = APIRouter(route_class=CountedRoute, responses=TEI_ERRORS, tags=["Ollama"])
models_router = APIRouter(route_class=GatewayRoute, responses=TEI_ERRORS, tags=["Ollama"])
DEFAULT_TAG = ":latest"


def untagged(name: str | None) -> str | None:
    """The served model an Ollama name means: `minilm:latest` is `minilm`."""
    return name.removesuffix(DEFAULT_TAG) if name else name


def check_options(options: dict[str, Any] | None, served: ServedModel) -> None:
    """Refuse the one runner option that changes an embedding: a context shorter than the model's."""
    num_ctx = (options or {}).get("num_ctx")
    if num_ctx is not None and (not isinstance(num_ctx, int) or num_ctx < served.max_length):
        raise validation(
            f"`options.num_ctx` {num_ctx!r} is below `{served.name}`'s max length {served.max_length}: "
            "prensa cuts inputs at the model's max length; leave num_ctx out or set it at least that high"
        )


async def _embedder(gw: Gateway, query_model: str | None, body_model: str) -> ServedModel:
    return await gw.registry.pick(
        Capability.DENSE, named_model(untagged(query_model), untagged(body_model))
    )


@router.post("/api/embed", response_model=OllamaEmbedResponse, summary="Ollama embeddings")
async def ollama_embed(
    request: OllamaEmbedRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    gw, context = http.gateway, http.context
    served = await _embedder(gw, model, request.model)
    check_options(request.options, served)
    texts: list[Item] = (
        ([request.input] if isinstance(request.input, str) else [*request.input])
        if request.input
        else []
    )
    vectors: Any = []
    tokens = 0
    if texts:  # Ollama answers an empty input with no embeddings (it loads the model)
        dim = served.dense_dim or 0
        dimensions = (
            request.dimensions if request.dimensions and 0 < request.dimensions < dim else None
        )
        result = await gw.service.run(
            DenseAsk(
                model=served,
                items=prompted(served, gw.settings, texts),
                truncation=Truncation(request.truncate, "right"),
                dimensions=dimensions,
            ),
            context,
        )
        vectors, tokens = result.rows, int(result.num_tokens.sum())
    return json_response(
        {
            "model": request.model,
            "embeddings": vectors,
            "total_duration": int((time.perf_counter() - context.received) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": tokens,
        },
        context,
    )


@router.post(
    "/api/embeddings",
    response_model=OllamaEmbeddingsResponse,
    summary="Ollama embeddings (older route)",
)
async def ollama_embeddings(
    request: OllamaEmbeddingsRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """One text, the model's pooled vector as Ollama's older route gives it: not normalised."""
    gw, context = http.gateway, http.context
    served = await _embedder(gw, model, request.model)
    check_options(request.options, served)
    if not request.prompt:
        return json_response({"embedding": []}, context)
    result = await gw.service.run(
        DenseAsk(
            model=served,
            items=prompted(served, gw.settings, [request.prompt]),
            truncation=Truncation(gw.settings.auto_truncate, "right"),
            normalize=False,
        ),
        context,
    )
    return json_response({"embedding": result.rows[0]}, context)


def _details(served: ServedModel) -> dict[str, Any]:
    return {
        "format": "onnx",
        "family": served.task,
        "families": [served.task],
        "parameter_size": "",
        "quantization_level": served.dtype,
        "parent_model": "",
    }


def _started(gw: Gateway) -> str:
    return datetime.fromtimestamp(gw.started, UTC).isoformat()


@models_router.get("/api/tags", response_model=OllamaTags, summary="Served models (Ollama's list)")
async def ollama_tags(http: GatewayRequest) -> Response:
    gw = http.gateway
    await gw.registry.ensure()
    return json_response(
        {
            "models": [
                {
                    "name": m.name + DEFAULT_TAG,
                    "model": m.name + DEFAULT_TAG,
                    "modified_at": _started(gw),
                    "size": 0,
                    "digest": hashlib.sha256(f"{m.name}@{m.revision}".encode()).hexdigest(),
                    "details": _details(m),
                }
                for m in gw.registry.models.values()
            ]
        }
    )


@models_router.post(
    "/api/show", response_model=OllamaShow, summary="One served model (Ollama's details)"
)
async def ollama_show(request: OllamaShowRequest, http: GatewayRequest) -> Response:
    gw = http.gateway
    name = untagged(request.model or request.name)
    if not name:
        raise validation("`model` is required")
    served = await gw.registry.pick(None, name)
    info: dict[str, Any] = {
        "general.architecture": served.task,
        f"{served.task}.context_length": served.max_length,
    }
    if served.dense_dim:
        info[f"{served.task}.embedding_length"] = served.dense_dim
    return json_response(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "modified_at": _started(gw),
            "details": _details(served),
            "model_info": info,
            "capabilities": ["embedding"] if served.can(Capability.DENSE) else [],
        }
    )
