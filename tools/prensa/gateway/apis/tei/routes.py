"""TEI's native routes (HTTP only: parse, call the service, shape the JSON).

TEI serves one model; prensa serves several. Every route takes the model from `?model=` or the
body's `model` field; without either a route uses `--default-model` when that model can answer
it, else the first served model (by name) that can. `/embed_colbert` is prensa's own: bge-m3
multi-vectors. Each inference route is an `Operation`, so TEI's default routes (`POST /`,
`/invocations`, `/vertex`; `apis.shared`) run the very same work, chosen by the body and the
model's task. TEI's `/rerank` and `/tokenize` bodies share their paths with vLLM's (`apis.shared`).
"""

from __future__ import annotations

import time
from importlib.metadata import version
from typing import Any, cast

import numpy as np
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from tokenizers import Tokenizer

from prensa.gateway.apis.answers import ranked_labels, ranking
from prensa.gateway.apis.common import activated, asked_chunking, cut_side
from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.m3.answers import embed_m3_payload
from prensa.gateway.apis.m3.protocol import M3Request
from prensa.gateway.apis.operation import Operation
from prensa.gateway.apis.tei.protocol import (
    ColbertRequest,
    DecodeRequest,
    EmbedRequest,
    Info,
    Prediction,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    SparseValue,
    TokenizeRequest,
    TokenLevelRequest,
)
from prensa.gateway.core.asks import (
    ColbertAsk,
    DenseAsk,
    HiddenAsk,
    RelevanceAsk,
    ScoresAsk,
    SparseAsk,
)
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import ServedModel, named_model
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.reranking import document_scores
from prensa.gateway.core.tokenization import (
    Item,
    Truncation,
    as_items,
    check_token_ids,
    tokens_json,
    too_many_tokens,
)
from prensa.gateway.errors import ErrorKind, GatewayError, error_body, validation
from prensa.gateway.http.routing import (
    CountedRoute,
    GatewayRequest,
    GatewayRoute,
    ModelParam,
    json_response,
)
from prensa.gateway.logs import ERROR_KEY
from prensa.gateway.state import Gateway
from prensa.layouts import Capability, ModelType

# read once: importlib.metadata scans site-packages on every call
PRENSA_VERSION = version("prensa")

router = APIRouter(route_class=CountedRoute, responses=TEI_ERRORS, tags=["TEI"])
open_router = APIRouter(route_class=GatewayRoute, tags=["operations"])


async def _embed(
    request: EmbedRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    if request.outputs is not None:
        if not served.is_m3:
            raise validation(
                f"`outputs` applies to bge-m3 models; `{served.name}` is a {served.task} model"
            )
        m3 = M3Request(
            model=request.model,
            inputs=request.inputs,
            outputs=request.outputs,
            prompt_name=request.prompt_name,
            truncate=request.truncate,
            truncation_direction=request.truncation_direction,
            return_tokens=False,
            colbert_encoding="float",
            chunking=request.chunking,
        )
        return await embed_m3_payload(m3, gw, served, context)
    items = prompted(served, gw.settings, as_items(request.inputs), request.prompt_name)
    result = await gw.service.run(
        DenseAsk(
            model=served,
            items=items,
            truncation=gw.service.truncation(request.truncate, request.truncation_direction),
            normalize=request.normalize,
            dimensions=request.dimensions,
            chunking=gw.service.chunking(*asked_chunking(request.chunking)),
        ),
        context,
    )
    return result.rows


def _token_level(
    request: TokenLevelRequest, gw: Gateway, served: ServedModel
) -> tuple[list[Item], Truncation]:
    """A per-token route's inputs, prompted, and their truncation."""
    items = prompted(served, gw.settings, as_items(request.inputs), request.prompt_name)
    return items, gw.service.truncation(request.truncate, request.truncation_direction)


async def _embed_sparse(
    request: TokenLevelRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    items, truncation = _token_level(request, gw, served)
    result = await gw.service.run(
        SparseAsk(model=served, items=items, truncation=truncation), context
    )
    return [
        [{"index": i, "value": v} for i, v in zip(ids.tolist(), weights.tolist())]
        for ids, weights in zip(result.ids, result.weights)
    ]


async def _embed_colbert(
    request: ColbertRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    items, truncation = _token_level(request, gw, served)
    ask = ColbertAsk(model=served, items=items, truncation=truncation, query=request.is_query)
    return (await gw.service.run(ask, context)).rows


async def _embed_all(
    request: TokenLevelRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    items, truncation = _token_level(request, gw, served)
    ask = HiddenAsk(model=served, items=items, truncation=truncation)
    return (await gw.service.run(ask, context)).rows


def predict_sequences(inputs: str | list[str] | list[list[str]]) -> tuple[list[list[str]], bool]:
    """TEI's `/predict` input: a text, one `[text(, text_pair)]` sequence, or a batch of them."""
    if isinstance(inputs, str):
        return [[inputs]], False
    if inputs and isinstance(inputs[0], list):
        return inputs, True
    return ([cast("list[str]", inputs)] if inputs else []), False


async def _predict(
    request: PredictRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    sequences, batched = predict_sequences(request.inputs)
    if any(len(s) not in (1, 2) for s in sequences):
        raise validation("each input is [text] or [text, text_pair]")
    texts, pairs = [s[0] for s in sequences], [s[1] if len(s) == 2 else None for s in sequences]
    hub = request.parameters  # huggingface_hub's text_classification reads a nested answer
    raw = request.raw_scores or (hub is not None and hub.function_to_apply == "none")
    scored = await gw.service.run(
        ScoresAsk(
            model=served,
            items=list(texts),
            pairs=pairs,
            truncation=gw.service.truncation(request.truncate, request.truncation_direction),
            raw_scores=raw,
        ),
        context,
    )
    ranked = ranked_labels(scored.values, served.id2label, hub.top_k if hub else None)
    return ranked if batched or hub is not None else ranked[0]


async def _rerank(
    request: RerankRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    direction = cut_side(
        request, request.truncation_direction, "truncation_direction" in request.model_fields_set
    )
    raw_said = request.raw_scores if "raw_scores" in request.model_fields_set else None
    ask = RelevanceAsk(
        model=served,
        query=request.query,
        texts=list(request.texts),
        truncation=gw.service.windowed(
            served,
            truncate=request.truncate,
            direction=direction,
            window=request.truncate_prompt_tokens,
            pairs=served.scores_pairs,
        ),
        raw_scores=not activated(raw_said, request),
        weights=request.weights,
        instruction=request.instruction,
    )
    scores, _ = await document_scores(
        gw.service, ask, context, max_tokens=request.max_tokens_per_doc
    )
    return [
        {
            "index": i,
            "score": float(scores[i]),
            **({"text": request.texts[i]} if request.return_text else {}),
        }
        for i in ranking(scores, request.top_n)
    ]


async def _similarity(
    request: SimilarityRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    parameters = request.parameters
    if not request.inputs.sentences:
        raise GatewayError(ErrorKind.EMPTY, "`sentences` cannot be empty")
    truncation = gw.service.truncation(
        parameters.truncate if parameters else None,
        parameters.truncation_direction if parameters else "right",
    )
    items = prompted(
        served,
        gw.settings,
        [request.inputs.source_sentence, *request.inputs.sentences],
        parameters.prompt_name if parameters else None,
    )
    result = await gw.service.run(
        DenseAsk(model=served, items=items, truncation=truncation), context
    )
    source, others = result.rows[0], result.rows[1:]
    cosine = (
        others @ source / np.maximum(np.linalg.norm(others, axis=1) * np.linalg.norm(source), 1e-12)
    )
    return cosine.astype(np.float32)


EMBED = Operation("embed", EmbedRequest, Capability.DENSE, _embed)
EMBED_SPARSE = Operation("embed_sparse", TokenLevelRequest, Capability.SPARSE, _embed_sparse)
EMBED_ALL = Operation("embed_all", TokenLevelRequest, Capability.HIDDEN, _embed_all)
EMBED_COLBERT = Operation("embed_colbert", ColbertRequest, Capability.COLBERT, _embed_colbert)
PREDICT = Operation("predict", PredictRequest, Capability.PREDICT, _predict)
RERANK = Operation("rerank", RerankRequest, Capability.RERANK, _rerank)
SIMILARITY = Operation("similarity", SimilarityRequest, Capability.DENSE, _similarity)
# What `POST /` may run for a model when the body does not say: its layout's default operation.
DEFAULT_OPERATIONS = {
    operation.name: operation for operation in (EMBED, EMBED_SPARSE, EMBED_COLBERT, PREDICT)
}


def default_operation(model: ServedModel) -> Operation:
    """The operation `model`'s layout runs for a body that names none (TEI: by model type)."""
    return DEFAULT_OPERATIONS[model.layout.default_operation]


@router.post("/embed", response_model=list[list[float]], summary="Dense embeddings")
async def embed(request: EmbedRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    return await EMBED.respond(request, http, model)


@router.post(
    "/embed_sparse", response_model=list[list[SparseValue]], summary="Sparse (lexical) embeddings"
)
async def embed_sparse(
    request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """bge-m3's sparse head or a SPLADE model: non-zero vocabulary weights, ascending ids."""
    return await EMBED_SPARSE.respond(request, http, model)


@router.post(
    "/embed_all", response_model=list[list[list[float]]], summary="Per-token hidden states"
)
async def embed_all(
    request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """The encoder's last hidden state for every token (special tokens included), no pooling."""
    return await EMBED_ALL.respond(request, http, model)


@router.post(
    "/embed_colbert",
    response_model=list[list[list[float]]],
    summary="ColBERT multi-vectors (bge-m3, PyLate and ColBERT models)",
)
async def embed_colbert(
    request: ColbertRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """L2-normalised vectors per token: bge-m3's after the first (CLS dropped, final `</s>` kept), as
    FlagEmbedding; a late-interaction model's as PyLate's `encode(is_query=...)`."""
    return await EMBED_COLBERT.respond(request, http, model)


@router.post(
    "/predict",
    response_model=list[Prediction] | list[list[Prediction]],
    summary="Classify texts or pairs",
)
async def predict(
    request: PredictRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Classifiers take texts or pairs; rerankers score pairs, and a lone text as a sequence of its own."""
    return await PREDICT.respond(request, http, model)


@router.post(
    "/similarity", response_model=list[float], summary="Cosine similarity to a source sentence"
)
async def similarity(
    request: SimilarityRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    return await SIMILARITY.respond(request, http, model)


def _tokens(
    tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool, limit: int, strip: bool
) -> Response:
    """`/tokenize`'s answer, built in a thread: a large body takes seconds to tokenize and serialise."""
    return json_response(tokens_json(tokenizer, texts, add_special_tokens, limit, strip))


def _decoded(
    tokenizer: Tokenizer, batch: list[list[int]], id_limit: int, skip_special_tokens: bool
) -> Response:
    """`/decode`'s answer, built in a thread: checking and decoding a 2 MB body of ids takes a while too."""
    for ids in batch:
        check_token_ids(ids, id_limit)
    return json_response(tokenizer.decode_batch(batch, skip_special_tokens=skip_special_tokens))


async def _tokenize(
    request: TokenizeRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Response:
    inputs: list[Item] = [request.inputs] if isinstance(request.inputs, str) else [*request.inputs]
    texts = gw.service.tokenizable(
        served, prompted(served, gw.settings, inputs, request.prompt_name)
    )
    return await gw.service.tokenizer_work(
        len(texts),
        _tokens,
        served.require_tokenizer(),
        texts,
        request.add_special_tokens,
        gw.service.tokenize_limit(served),
        served.strip_texts,
    )


TOKENIZE = Operation("tokenize", TokenizeRequest, None, _tokenize)


@router.post("/decode", response_model=list[str], summary="Token ids back to text")
async def decode(
    request: DecodeRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, named_model(model, request.model))
    batch = [request.ids] if not request.ids or isinstance(request.ids[0], int) else request.ids
    gw.service.check_batch(len(batch))
    limit, ids = gw.service.tokenize_limit(served), sum(map(len, batch))
    if ids > limit:
        raise too_many_tokens(limit, f"{ids} ids")
    return await gw.service.tokenizer_work(
        len(batch),
        _decoded,
        served.require_tokenizer(),
        batch,
        served.token_id_limit,
        request.skip_special_tokens,
    )


def model_info(model: ServedModel) -> dict[str, object]:
    labels = {str(i): label for i, label in enumerate(model.id2label)}
    kind = model.layout.model_type
    model_type = (
        {kind.value: {"pooling": model.layout.token_pooling or model.pooling}}
        if kind is ModelType.EMBEDDING
        else {kind.value: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}}
    )
    return {
        "model_id": model.source,
        "model_sha": model.revision or None,
        "model_dtype": model.dtype,
        "served_model_name": model.name,
        "model_type": model_type,
        "task": model.task,
        "max_input_length": model.max_length,
        "max_batch_tokens": model.max_batch_tokens,
        "max_batch_requests": model.max_batch_size,
        "prompts": model.prompts,
    }


@router.get("/info", response_model=Info, summary="Model and server limits")
async def info(http: GatewayRequest, model: ModelParam = None) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, model)
    settings = gw.settings
    return json_response(
        {
            **model_info(served),
            "max_concurrent_requests": settings.max_concurrent_requests,
            "max_client_batch_size": settings.max_client_batch_size,
            "auto_truncate": settings.auto_truncate,
            "tokenization_workers": None,
            "version": PRENSA_VERSION,
            "models": [model_info(m) for m in gw.registry.models.values()],
        }
    )


@open_router.get(
    "/health",
    summary="200 (with Infinity's `{unix}`) when Triton and every stage of every served model "
    "are ready, else 503 naming what is not",
)
@open_router.get("/", include_in_schema=False)
@open_router.get("/ping", include_in_schema=False)
@open_router.get("/v1/health/ready", include_in_schema=False)  # NIM's readiness route
async def health(http: GatewayRequest) -> Response:
    problem = await http.gateway.unhealthy()
    if problem is None:  # TEI's clients read the status; Infinity's the time
        return json_response({"unix": time.time()})
    error = GatewayError(ErrorKind.UNHEALTHY, f"unhealthy: {problem}")
    setattr(http.state, ERROR_KEY, error.message)  # for the request's log line
    return Response(
        error_body(error, request_id=http.state.request_id),
        status_code=error.status,
        media_type="application/json",
    )


@open_router.get("/v1/health/live", include_in_schema=False)
async def live() -> Response:
    """NIM's liveness route: the gateway answers, whatever Triton's state (`/health` tells that)."""
    return Response(status_code=200)


@open_router.get("/metrics", summary="Prometheus metrics (TEI names)")
async def metrics(http: GatewayRequest) -> Response:
    gw = http.gateway
    gw.metrics.set_readiness(await gw.registry.readiness())
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE_LATEST)
