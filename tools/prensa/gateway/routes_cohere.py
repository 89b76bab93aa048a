"""Cohere's `/v1/rerank`, `/v2/rerank`, `/v1/embed` and `/v2/embed`, and Jina's `/v1/rerank`
(HTTP only). Errors use the `{"message", ...}` shape both SDKs read.

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

from prensa.gateway.chunking import best_of, chunk_texts, cut_texts
from prensa.gateway.models import Capability, ServedModel, named_model
from prensa.gateway.prompts import prompted
from prensa.gateway.protocol_cohere import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    RerankDocument,
    RerankResponse,
    RerankV1Request,
    RerankV2Request,
)
from prensa.gateway.protocol_common import truncate_end
from prensa.gateway.protocol_openai import ERRORS
from prensa.gateway.quantize import as_type, check_ranged
from prensa.gateway.request_context import RequestContext
from prensa.gateway.responses import (
    CountedRoute,
    Gateway,
    GatewayRequest,
    ModelParam,
    json_response,
)
from prensa.gateway.tokenization import Item, Truncation

router = APIRouter(route_class=CountedRoute, responses=ERRORS, tags=["Cohere and Jina"])
COHERE_SDK_HEADER = "x-fern-sdk-name"


def cohere_meta(version: str, **billed: int) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": billed}


async def document_scores(
    gw: Gateway,
    served: ServedModel,
    query: str,
    texts: list[str],
    truncation: Truncation,
    context: RequestContext,
    max_chunks: int | None = None,
    max_tokens: int | None = None,
    instruction: str | None = None,
) -> tuple[npt.NDArray[Any], int]:
    """One relevance score per document (sigmoid of the logit) and the tokens read. `max_tokens`
    cuts documents first; `max_chunks` scores up to that many windows of a long document and keeps
    its best, instead of truncating it."""
    if max_tokens is not None and max_tokens < served.max_length:
        texts = await gw.service.tokenizer_work(
            len(texts), cut_texts, served.require_tokenizer(), texts, max_tokens
        )
    if not max_chunks:
        values, tokens = await gw.service.relevance(
            served, query, texts, truncation, False, context, instruction=instruction
        )
        return values, int(tokens.sum())
    # Windows beside what precedes each document: the query, or an LLM reranker's prompt around it.
    beside = (
        served.pair_template.text(query, "", instruction)
        if served.pair_template is not None
        else query
    )
    windows = await gw.service.tokenizer_work(
        len(texts),
        chunk_texts,
        served.require_tokenizer(),
        beside,
        texts,
        served.max_length,
        max_chunks,
        None if served.pair_template is not None else served.pair_truncation,
    )
    values, tokens = await gw.service.relevance(
        served,
        query,
        cast("list[str]", windows.items),
        truncation,
        False,
        context,
        instruction=instruction,
    )
    return best_of(values, windows), int(tokens.sum())


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
    max_tokens: int | None = None,
) -> Response:
    gw, context = http.gateway, http.context
    served = await gw.registry.pick(Capability.RERANK, named_model(model, request.model))
    texts = document_texts(request.documents)
    scores, tokens = await document_scores(
        gw,
        served,
        request.query,
        texts,
        gw.service.truncation(*truncate_end(None)),
        context,
        max_chunks,
        max_tokens,
        request.instruction,
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
    return await cohere_rerank(
        request, http, model, "2", request.return_documents, max_tokens=request.max_tokens_per_doc
    )


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
    result = await gw.service.dense(
        served,
        items,
        gw.service.truncation(*truncate_end(request.truncate)),
        True,
        request.output_dimension,
        context,
    )
    tokens = int(result.num_tokens.sum())
    meta = cohere_meta(version, input_tokens=tokens)
    if version == "1" and request.embedding_types is None:
        embeddings: Any = result.rows
        response_type = "embeddings_floats"
    else:
        assert isinstance(result.rows, np.ndarray)  # `dense` answers one array
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
