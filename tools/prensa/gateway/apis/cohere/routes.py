"""Cohere's `/v1/rerank`, `/v2/rerank`, `/v1/embed` and `/v2/embed`, and Jina's `/v1/rerank`
(HTTP only). Errors use the `{"message", ...}` shape both SDKs read, with Cohere's 400 for a body
it cannot read (`CohereError`).

`/v1/rerank` serves Cohere's v1 and Jina's request, which differ in one default: Jina echoes the
documents unless told not to, Cohere does not. Cohere's SDKs identify themselves (`X-Fern-SDK-Name:
cohere`), so they get Cohere's default and everyone else Jina's.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Response

from prensa.gateway.apis.cohere.protocol import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    RerankDocument,
    RerankResponse,
    RerankV1Request,
    RerankV2Request,
)
from prensa.gateway.apis.common import activated, cut_side, truncate_end
from prensa.gateway.apis.errors import COHERE_ERRORS
from prensa.gateway.core.asks import DenseAsk, RelevanceAsk
from prensa.gateway.core.chunking import cut_texts
from prensa.gateway.core.encodings import as_type, check_ranged
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import named_model
from prensa.gateway.core.reranking import document_scores
from prensa.gateway.core.tokenization import Item
from prensa.gateway.http.routing import CountedRoute, GatewayRequest, ModelParam, json_response
from prensa.layouts import Capability

router = APIRouter(route_class=CountedRoute, responses=COHERE_ERRORS, tags=["Cohere and Jina"])
COHERE_SDK_HEADER = "x-fern-sdk-name"


def cohere_meta(version: str, **billed: int) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": billed}


def document_texts(documents: list[str | RerankDocument]) -> list[str]:
    return [d.text if isinstance(d, RerankDocument) else d for d in documents]


def ranked(
    scores: npt.NDArray[Any], texts: list[str], top_n: int | None, with_documents: bool
) -> list[dict[str, Any]]:
    results = []
    for index in np.argsort(-scores, kind="stable").tolist()[:top_n]:
        result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
        if with_documents:
            result["document"] = {"text": texts[index]}
        results.append(result)
    return results


async def cohere_rerank(
    request: RerankV1Request | RerankV2Request,
    http: GatewayRequest,
    model: str | None,
    version: str,
    with_documents: bool,
    max_chunks: int | None = None,
) -> Response:
    gw, context = http.gateway, http.context
    served = await gw.registry.pick(Capability.RERANK, named_model(model, request.model))
    texts = document_texts(request.documents)
    truncation = gw.service.windowed(
        served,
        truncate=None,
        direction=cut_side(request),
        window=request.truncate_prompt_tokens,
        pairs=served.scores_pairs,
    )
    scores, tokens = await document_scores(
        gw.service,
        RelevanceAsk(
            model=served,
            query=request.query,
            texts=texts,
            truncation=truncation,
            raw_scores=not activated(None, request),
            instruction=request.instruction,
        ),
        context,
        max_chunks=max_chunks,
        max_tokens=request.max_tokens_per_doc,
    )
    meta = cohere_meta(version, search_units=1) | (
        {"tokens": {"input_tokens": tokens}} if version == "2" else {}
    )
    return json_response(
        {
            "id": str(uuid.uuid4()),
            "model": served.name,
            "results": ranked(scores, texts, request.top_n, with_documents),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "meta": meta,
        },
        context,
    )


@router.post(
    "/v1/rerank",
    response_model=RerankResponse,
    response_model_exclude_none=True,
    summary="Rerank documents (Cohere v1, Jina)",
)
async def rerank_v1(
    request: RerankV1Request, http: GatewayRequest, model: ModelParam = None
) -> Response:
    with_documents = request.return_documents
    if with_documents is None:
        with_documents = http.headers.get(COHERE_SDK_HEADER, "").lower() != "cohere"
    return await cohere_rerank(
        request, http, model, "1", with_documents, max_chunks=request.max_chunks_per_doc
    )


@router.post(
    "/v2/rerank",
    response_model=RerankResponse,
    response_model_exclude_none=True,
    summary="Rerank documents (Cohere v2)",
)
async def rerank_v2(
    request: RerankV2Request, http: GatewayRequest, model: ModelParam = None
) -> Response:
    # Cohere's default leaves documents out; vLLM's clients, which send no `return_documents`, read them
    return await cohere_rerank(request, http, model, "2", request.return_documents is not False)


def embeddings_by_type(
    vectors: npt.NDArray[Any], types: Sequence[str], ranges: npt.NDArray[Any] | None
) -> dict[str, Any]:
    """Cohere's `embeddings` object: one list of vectors per requested type."""
    # in request order, once each
    return {kind: as_type(vectors, kind, ranges) for kind in dict.fromkeys(types)}


async def cohere_embed(
    request: CohereEmbedRequest, http: GatewayRequest, model: str | None, version: str
) -> Response:
    gw, context = http.gateway, http.context
    served = await gw.registry.pick(Capability.DENSE, named_model(model, request.model))
    types = request.embedding_types or ["float"]
    check_ranged(
        served.name, served.dense_ranges, request.output_dimension or served.dense_dim or 0, types
    )
    items = prompted(served, gw.settings, list(request.texts), input_type=request.input_type)
    if request.max_tokens is not None and request.max_tokens < served.max_length:
        tokenizer = served.require_tokenizer()
        content = request.max_tokens - tokenizer.num_special_tokens_to_add(False)
        items = cast(
            "list[Item]",
            await gw.service.tokenizer_work(len(items), cut_texts, tokenizer, items, content),
        )
    result = await gw.service.run(
        DenseAsk(
            model=served,
            items=items,
            truncation=gw.service.truncation(*truncate_end(request.truncate)),
            dimensions=request.output_dimension,
        ),
        context,
    )
    tokens = int(result.num_tokens.sum())
    meta = cohere_meta(version, input_tokens=tokens)
    if version == "1" and request.embedding_types is None:
        embeddings: Any = result.rows
        response_type = "embeddings_floats"
    else:
        embeddings, response_type = (
            embeddings_by_type(result.rows, types, served.dense_ranges),
            "embeddings_by_type",
        )
    return json_response(
        {
            "id": str(uuid.uuid4()),
            "embeddings": embeddings,
            "texts": request.texts,
            "meta": meta,
            "response_type": response_type,
        },
        context,
    )


@router.post("/v1/embed", response_model=CohereEmbedResponse, summary="Embed texts (Cohere v1)")
async def embed_v1(
    request: CohereEmbedRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Without `embedding_types`: float vectors (`embeddings_floats`); with them, by type."""
    return await cohere_embed(request, http, model, "1")


@router.post("/v2/embed", response_model=CohereEmbedResponse, summary="Embed texts (Cohere v2)")
async def embed_v2(
    request: CohereEmbedRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Always by type; `input_type` picks the model's query or document prompt."""
    return await cohere_embed(request, http, model, "2")
