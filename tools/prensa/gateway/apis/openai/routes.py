"""OpenAI-compatible `/v1/embeddings`' answer (its route, also at `/embeddings` as TEI, is
`apis.shared`'s: vLLM's body arrives there too; NIM's `input_type`, `truncate`, `embedding_type` and
`-query`/`-passage` model names, Jina's `task`, `embedding_type` and `late_chunking`), Jina's
`/v1/multi-vector`, and `/v1/models`, which SDKs and LiteLLM health checks read (HTTP only). Errors
on these routes use OpenAI's `{"message","code","type"}`."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Response

from prensa.gateway.apis.common import asked_chunking, cut_side, read_priority, truncate_end
from prensa.gateway.apis.errors import MESSAGE_ERRORS
from prensa.gateway.apis.openai.protocol import (
    EmbeddingRequest,
    ModelCard,
    ModelList,
    MultiVectorResponse,
)
from prensa.gateway.apis.operation import Operation
from prensa.gateway.apis.vllm.protocol import VllmEmbeddingRequest
from prensa.gateway.core.asks import ColbertAsk, DenseAsk, LateChunksAsk
from prensa.gateway.core.encodings import RANGED, as_type, check_ranged
from prensa.gateway.core.limits import Permits
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel, named_model
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import Item, Truncation, as_items
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

router = APIRouter(route_class=CountedRoute, responses=MESSAGE_ERRORS, tags=["OpenAI"])
# The bodies `/v1/embeddings` takes: OpenAI's (with NIM's, Jina's and PyLate's fields) or vLLM's
# (`apis.shared` tells them apart); both run the same operation, each unsetting the other's fields.
AnyEmbeddingRequest = EmbeddingRequest | VllmEmbeddingRequest
models_router = APIRouter(route_class=GatewayRoute, responses=MESSAGE_ERRORS, tags=["OpenAI"])
# NIM's and Cohere's `truncate`, as the gateway's truncation; None leaves it to --auto-truncate.
# NIM's model names for one role: `<model>-query`, `<model>-passage`.
ROLE_SUFFIXES = {"-query": "query", "-passage": "passage"}
# Jina's retrieval tasks, for models without a prompt of that name: the input types they are.
JINA_ROLES = {"retrieval.query": "query", "retrieval.passage": "passage"}
# the input types whose texts a late-interaction model frames as queries
QUERY_ROLES = ("query", "search_query")


async def _embedder(
    gw: Gateway,
    query_model: str | None,
    body_model: str | None,
    capability: Capability = Capability.DENSE,
) -> tuple[ServedModel, str | None]:
    """The model asked for, and the input type its name implies: NIM's `<model>-query` and
    `<model>-passage` name `<model>` with that role, unless a model of the full name is served."""
    name = named_model(query_model, body_model)
    if name and name not in gw.registry.models:
        await gw.registry.ensure()
        for suffix, role in ROLE_SUFFIXES.items():
            if name.endswith(suffix) and name.removesuffix(suffix) in gw.registry.models:
                return await gw.registry.pick(capability, name.removesuffix(suffix)), role
    return await gw.registry.pick(capability, name), None


def prompt_choice(
    request: AnyEmbeddingRequest, served: ServedModel, role: str | None
) -> tuple[str | None, str | None]:
    """(prompt_name, input_type) from `input_type`, the model name's role and Jina's `task`; two
    that disagree, and a task the model has no prompt for, are refused."""
    input_type: str | None = request.input_type
    if role is not None:
        if input_type is not None and input_type != role:
            raise validation(f"the model name says `{role}` and `input_type` says `{input_type}`")
        input_type = role
    if request.task is None:
        return None, input_type
    if request.task in served.prompts:
        return request.task, None
    task_role = JINA_ROLES.get(request.task)
    if task_role is None:
        known = ", ".join(sorted(served.prompts)) or "none"
        raise validation(
            f"`task` {request.task} needs a prompt of that name, which model `{served.name}` does not "
            f"have (its prompts: {known})"
        )
    if input_type is not None and input_type != task_role:
        raise validation(f"`task` {request.task} and `input_type` {input_type} disagree")
    return None, task_role


def embedding_truncation(
    request: AnyEmbeddingRequest, gw: Gateway, served: ServedModel
) -> Truncation:
    """NIM's `truncate` or vLLM's `truncate_prompt_tokens`, not both."""
    truncate, direction = truncate_end(request.truncate)
    direction = cut_side(request, direction, request.truncate is not None)
    return gw.service.windowed(
        served, truncate=truncate, direction=direction, window=request.truncate_prompt_tokens
    )


def embedding_kind(request: AnyEmbeddingRequest, served: ServedModel) -> str:
    """The type each vector is written in (`encodings.as_type`), checked before any inference."""
    kind = request.embedding_type or "float"
    if request.encoding_format == "base64":
        if kind not in ("float", "base64"):
            raise validation(
                f"`encoding_format` base64 carries float vectors; `embedding_type` {kind} is integers"
            )
        return "base64"
    if kind in RANGED and request.normalize is False:
        raise validation(
            f"`embedding_type` {kind} is calibrated on normalised vectors; drop `normalize: false`"
        )
    check_ranged(
        served.name, served.dense_ranges, request.dimensions or served.dense_dim or 0, [kind]
    )
    return kind


async def embeddings_payload(
    request: AnyEmbeddingRequest,
    gw: Gateway,
    served: ServedModel,
    context: RequestContext,
    role: str | None = None,
) -> dict[str, Any]:
    """`/v1/embeddings`' answer on `served`; `role` is the input type its requested name implies."""
    prompt_name, input_type = prompt_choice(request, served, role)
    vectors_per_token = (
        request.return_multivector or request.is_query is not None or served.layout.token_vectors
    )
    if vectors_per_token:
        items = prompted(served, gw.settings, as_items(request.input), prompt_name, input_type)
        return await multivector_payload(
            request, gw, served, context, items=items, input_type=input_type
        )
    kind = embedding_kind(request, served)  # checked before the prompt, as before any inference
    items = prompted(served, gw.settings, as_items(request.input), prompt_name, input_type)
    if request.late_chunking:
        given = [
            f"`{name}`"
            for name, value in (
                ("chunking", request.chunking),
                ("truncate_prompt_tokens", request.truncate_prompt_tokens),
                ("truncate", request.truncate if request.truncate != "NONE" else None),
            )
            if value is not None
        ]
        if given:
            raise validation(
                f"`late_chunking` reads the inputs whole in one pass: drop {', '.join(given)}"
            )
        result = await gw.service.run(
            LateChunksAsk(
                model=served,
                items=items,
                normalize=request.normalize is not False,
                dimensions=request.dimensions,
            ),
            context,
        )
    else:
        truncation = embedding_truncation(request, gw, served)
        chunking = gw.service.chunking(*asked_chunking(request.chunking))
        if truncation.window is not None:  # a window of its own cuts long inputs: no chunks
            if request.chunking is not None and request.chunking.enabled:
                raise validation("give `chunking` or `truncate_prompt_tokens`, not both")
            chunking = None
        result = await gw.service.run(
            DenseAsk(
                model=served,
                items=items,
                truncation=truncation,
                normalize=request.normalize is not False,
                dimensions=request.dimensions,
                chunking=chunking,
            ),
            context,
        )
    tokens = int(result.num_tokens.sum())
    rows = (
        result.rows
        if kind == "float"
        else as_type(
            np.asarray(result.rows),
            kind,
            served.dense_ranges,
            request.embed_dtype,
            request.endianness,
        )
    )
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "embedding": row,
                "index": i,
                **({"chunks": context.chunks[i]} if context.chunks else {}),
            }
            for i, row in enumerate(rows)
        ],
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def multivector_payload(
    request: AnyEmbeddingRequest,
    gw: Gateway,
    served: ServedModel,
    context: RequestContext,
    *,
    items: list[Item],
    input_type: str | None,
) -> dict[str, Any]:
    """Each input's token vectors: Jina's answer (`return_multivector`, each in `embeddings`), or
    PyLate's server's (each in `embedding`). Queries where `is_query` says so, else where the
    request's input type or task says its inputs are queries; without any of them, Jina reads
    documents and PyLate's server queries. What a single vector's fields would change is refused."""
    given = [
        f"`{name}`"
        for name, value in (
            ("late_chunking", request.late_chunking),
            ("chunking", request.chunking),
            ("dimensions", request.dimensions),
            ("normalize: false", request.normalize is False),
            ("encoding_format: base64", request.encoding_format == "base64"),
            (
                f"embedding_type: {request.embedding_type}",
                request.embedding_type not in (None, "float"),
            ),
        )
        if value
    ]
    if given:
        raise validation(f"token vectors are answered as floats per token: drop {', '.join(given)}")
    jina = bool(request.return_multivector)
    if request.is_query is not None:
        query = request.is_query
    elif input_type is not None:
        query = input_type in QUERY_ROLES
    else:
        query = not jina
    result = await gw.service.run(
        ColbertAsk(
            model=served,
            items=items,
            truncation=embedding_truncation(request, gw, served),
            query=query,
        ),
        context,
    )
    tokens = int(result.num_tokens.sum())
    field, kind = ("embeddings", "embeddings") if jina else ("embedding", "embedding")
    return {
        "object": "list",
        "data": [
            {"object": kind, field: vectors, "index": i} for i, vectors in enumerate(result.rows)
        ],
        "model": served.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def embeddings_capability(
    request: AnyEmbeddingRequest, gw: Gateway, name: str | None
) -> Capability:
    """Token vectors where the body asks for them (Jina's `return_multivector`, PyLate's server's
    `is_query`) or names a late-interaction model; else a dense vector."""
    named = gw.registry.models.get(name or "")
    if (
        request.return_multivector
        or request.is_query is not None
        or (named is not None and named.layout.token_vectors)
    ):
        return Capability.COLBERT
    return Capability.DENSE


# `/v1/embeddings`' bodies as operations, for `/invocations` and `POST /` (`apis.shared`)
EMBEDDINGS = Operation("openai_embeddings", EmbeddingRequest, Capability.DENSE, embeddings_payload)
VLLM_EMBEDDINGS = Operation(
    "openai_embeddings", VllmEmbeddingRequest, Capability.DENSE, embeddings_payload
)


async def answer_embeddings(
    request: AnyEmbeddingRequest, http: GatewayRequest, model: str | None
) -> Response:
    """`/v1/embeddings`' answer (its route is `apis.shared`'s): dense, L2-normalised vectors (unless
    vLLM's `normalize: false`); right truncation when --auto-truncate is on (the default). Token
    vectors with Jina's `return_multivector`, and on a late-interaction model as PyLate's server
    answers them."""
    await http.gateway.registry.ensure()
    capability = embeddings_capability(request, http.gateway, named_model(model, request.model))
    served, role = await _embedder(http.gateway, model, request.model, capability)
    read_priority(request, http.context)
    return json_response(
        await embeddings_payload(request, http.gateway, served, http.context, role), http.context
    )


@router.post(
    "/v1/multi-vector", response_model=MultiVectorResponse, summary="Jina's multi-vector embeddings"
)
async def jina_multi_vector(
    request: EmbeddingRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Jina's ColBERT endpoint: `/v1/embeddings` with `return_multivector`; `input_type` query or
    document."""
    request = request.model_copy(update={"return_multivector": True})
    served, role = await _embedder(http.gateway, model, request.model, Capability.COLBERT)
    return json_response(
        await embeddings_payload(request, http.gateway, served, http.context, role), http.context
    )


# Infinity's names of what a model serves
INFINITY_CAPABILITIES = {
    Capability.DENSE: "embed",
    Capability.RERANK: "rerank",
    Capability.PREDICT: "classify",
}


def model_card(model: ServedModel, created: int, permits: Permits) -> dict[str, object]:
    """OpenAI's model card, with vLLM's `root` and `max_model_len` and Infinity's `backend`,
    `capabilities` and `stats` (the gateway's inputs in flight, shared by every model)."""
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "prensa",
        "root": model.name,
        "task": model.task,
        "max_model_len": model.max_length,
        "backend": "triton",
        "capabilities": [name for cap, name in INFINITY_CAPABILITIES.items() if model.can(cap)],
        "stats": {
            "batch_size": model.max_batch_size,
            "queue_absolute": permits.in_use,
            "queue_fraction": permits.in_use / max(permits.capacity, 1),
        },
    }


@models_router.get("/v1/models", response_model=ModelList, summary="Served models (OpenAI's list)")
@models_router.get("/models", response_model=ModelList, include_in_schema=False)  # Infinity's
async def list_models(http: GatewayRequest) -> Response:
    gw = http.gateway
    await gw.registry.ensure()
    created = int(gw.started)
    cards = [model_card(m, created, gw.service.permits) for m in gw.registry.models.values()]
    return json_response({"object": "list", "data": cards})


@models_router.get("/v1/models/{model_id}", response_model=ModelCard, summary="One served model")
async def retrieve_model(model_id: str, http: GatewayRequest) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, model_id)
    return json_response(model_card(served, int(gw.started), gw.service.permits))
