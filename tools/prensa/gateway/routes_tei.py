"""TEI's native routes (HTTP only: parse, call the service, shape the JSON).

TEI serves one model; prensa serves several. Every route takes an optional `?model=` query
parameter; without it a route uses `--default-model` when that model can answer it, else the
first served model (by name) that can. `/embed_colbert` is prensa's own: bge-m3 multi-vectors.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Response
from prometheus_client import CONTENT_TYPE_LATEST

from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.models import Capability, ServedModel
from prensa.gateway.protocol_tei import (
    DecodeRequest,
    EmbedRequest,
    ErrorResponse,
    Info,
    Prediction,
    PredictRequest,
    Rank,
    RerankRequest,
    SimilarityRequest,
    SimpleToken,
    SparseValue,
    TokenizeRequest,
    TokenLevelRequest,
)
from prensa.gateway.responses import CountedRoute, GatewayRequest, GatewayRoute, json_response
from prensa.gateway.service import check_prompt
from prensa.gateway.tokenization import as_items, check_token_ids, simple_tokens

PRENSA_VERSION = version("prensa")  # read once: importlib.metadata scans site-packages on every call
ModelParam = Annotated[str | None, Query(description="Served model; default: --default-model or the first that fits.")]
ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 422, 424, 429, 503)}

router = APIRouter(route_class=CountedRoute, responses=ERRORS, tags=["TEI"])
open_router = APIRouter(route_class=GatewayRoute, tags=["operations"])


@router.post("/embed", response_model=list[list[float]], summary="Dense embeddings")
async def embed(request: EmbedRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.DENSE, model)
    check_prompt(served, request.prompt_name)
    result = await gw.service.dense(served, as_items(request.inputs),
                                    gw.service.truncation(request.truncate, request.truncation_direction),
                                    request.normalize, request.dimensions, timings)
    return json_response(result.rows, timings)


@router.post("/embed_sparse", response_model=list[list[SparseValue]], summary="Sparse (lexical) embeddings")
async def embed_sparse(request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """bge-m3's sparse head or a SPLADE model: non-zero vocabulary weights, ascending ids."""
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.SPARSE, model)
    check_prompt(served, request.prompt_name)
    result = await gw.service.sparse(served, as_items(request.inputs),
                                     gw.service.truncation(request.truncate, request.truncation_direction), timings)
    payload = [[{"index": i, "value": v} for i, v in zip(ids.tolist(), weights.tolist())]
               for ids, weights in zip(result.rows, result.weights)]
    return json_response(payload, timings)


@router.post("/embed_all", response_model=list[list[list[float]]], summary="Per-token hidden states")
async def embed_all(request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """The encoder's last hidden state for every token (special tokens included), no pooling."""
    return await _per_token(request, http, model, Capability.HIDDEN, http.gateway.service.hidden)


@router.post("/embed_colbert", response_model=list[list[list[float]]], summary="ColBERT multi-vectors (bge-m3)")
async def embed_colbert(request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    """One L2-normalised vector per token after the first (CLS dropped, final `</s>` kept), as FlagEmbedding."""
    return await _per_token(request, http, model, Capability.COLBERT, http.gateway.service.colbert)


async def _per_token(request: TokenLevelRequest, http: GatewayRequest, model: str | None, capability: Capability,
                     compute) -> Response:
    """Shared body of the per-token routes: pick the model, run `compute`, return its rows."""
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(capability, model)
    check_prompt(served, request.prompt_name)
    result = await compute(served, as_items(request.inputs),
                           gw.service.truncation(request.truncate, request.truncation_direction), timings)
    return json_response(result.rows, timings)


def predict_sequences(inputs: str | list[str] | list[list[str]]) -> tuple[list[list[str]], bool]:
    """TEI's `/predict` input: a text, one `[text(, text_pair)]` sequence, or a batch of them."""
    if isinstance(inputs, str):
        return [[inputs]], False
    if inputs and isinstance(inputs[0], list):
        return inputs, True
    return ([inputs] if inputs else []), False


@router.post("/predict", response_model=list[Prediction] | list[list[Prediction]], summary="Classify texts or pairs")
async def predict(request: PredictRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw, timings = http.gateway, http.timings
    sequences, batched = predict_sequences(request.inputs)
    if any(len(s) not in (1, 2) for s in sequences):
        raise validation("each input is [text] or [text, text_pair]")
    served = await gw.registry.pick(Capability.PREDICT, model)
    texts, pairs = [s[0] for s in sequences], [s[1] if len(s) == 2 else None for s in sequences]
    values, _ = await gw.service.scores(served, texts, pairs,
                                        gw.service.truncation(request.truncate, request.truncation_direction),
                                        request.raw_scores, timings)
    labels = served.id2label
    ranked = [[{"score": row[j], "label": labels[j]} for j in np.argsort(-np.asarray(row), kind="stable").tolist()]
              for row in values.tolist()]
    return json_response(ranked if batched else ranked[0], timings)


@router.post("/rerank", response_model=list[Rank], response_model_exclude_none=True, summary="Rerank passages")
async def rerank(request: RerankRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.RERANK, model)
    values, _ = await gw.service.scores(served, [request.query] * len(request.texts), list(request.texts),
                                        gw.service.truncation(request.truncate, request.truncation_direction),
                                        request.raw_scores, timings)
    scores = values[:, 0]
    ranks = []
    for index in np.argsort(-scores, kind="stable").tolist():
        rank = {"index": index, "score": float(scores[index])}
        if request.return_text:
            rank["text"] = request.texts[index]
        ranks.append(rank)
    return json_response(ranks, timings)


@router.post("/similarity", response_model=list[float], summary="Cosine similarity to a source sentence")
async def similarity(request: SimilarityRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw, timings = http.gateway, http.timings
    served = await gw.registry.pick(Capability.DENSE, model)
    parameters = request.parameters
    check_prompt(served, parameters.prompt_name if parameters else None)
    if not request.inputs.sentences:
        raise GatewayError(ErrorKind.EMPTY, "`sentences` cannot be empty")
    truncation = gw.service.truncation(parameters.truncate if parameters else None,
                                       parameters.truncation_direction if parameters else "right")
    result = await gw.service.dense(served, [request.inputs.source_sentence, *request.inputs.sentences], truncation,
                                    True, None, timings)
    source, others = result.rows[0], result.rows[1:]
    cosine = others @ source / np.maximum(np.linalg.norm(others, axis=1) * np.linalg.norm(source), 1e-12)
    return json_response(cosine.astype(np.float32), timings)


@router.post("/tokenize", response_model=list[list[SimpleToken]], summary="Tokenize with the model's tokenizer")
async def tokenize(request: TokenizeRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, model)
    check_prompt(served, request.prompt_name)
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    if not texts:
        raise GatewayError(ErrorKind.EMPTY, "`inputs` cannot be empty")
    tokenizer = served.require_tokenizer()
    return json_response([simple_tokens(tokenizer, text, request.add_special_tokens) for text in texts])


@router.post("/decode", response_model=list[str], summary="Token ids back to text")
async def decode(request: DecodeRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, model)
    batch = [request.ids] if not request.ids or isinstance(request.ids[0], int) else request.ids
    tokenizer = served.require_tokenizer()
    for ids in batch:
        check_token_ids(ids, served.token_id_limit)
    return json_response(tokenizer.decode_batch(batch, skip_special_tokens=request.skip_special_tokens))


def model_info(model: ServedModel) -> dict[str, object]:
    labels = {str(i): label for i, label in enumerate(model.id2label)}
    kinds = {"rerank": "reranker", "classify": "classifier"}
    model_type = ({kinds[model.task]: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}}
                  if model.task in kinds else
                  {"embedding": {"pooling": "splade" if model.task == "splade" else model.pooling}})
    return {"model_id": model.source, "model_sha": model.revision or None, "model_dtype": model.dtype,
            "served_model_name": model.name, "model_type": model_type, "task": model.task,
            "max_input_length": model.max_length, "max_batch_tokens": model.max_batch_tokens,
            "max_batch_requests": model.max_batch_size}


@router.get("/info", response_model=Info, summary="Model and server limits")
async def info(http: GatewayRequest, model: ModelParam = None) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, model)
    settings = gw.settings
    return json_response({
        **model_info(served),
        "max_concurrent_requests": settings.max_concurrent_requests,
        "max_client_batch_size": settings.max_client_batch_size,
        "auto_truncate": settings.auto_truncate,
        "tokenization_workers": None,
        "version": PRENSA_VERSION,
        "models": [model_info(m) for m in gw.registry.models.values()],
    })


UNHEALTHY = b'{"error":"unhealthy","error_type":"Unhealthy"}'


@open_router.get("/health", summary="200 when Triton and every served model are ready, else 503")
@open_router.get("/", include_in_schema=False)
@open_router.get("/ping", include_in_schema=False)
async def health(http: GatewayRequest) -> Response:
    gw = http.gateway
    try:
        await gw.registry.ensure()
    except GatewayError:
        return Response(UNHEALTHY, status_code=503, media_type="application/json")
    if await gw.client.is_ready(list(gw.registry.models)):
        return Response(status_code=200)
    return Response(UNHEALTHY, status_code=503, media_type="application/json")


@open_router.get("/metrics", summary="Prometheus metrics (TEI names)")
async def metrics(http: GatewayRequest) -> Response:
    return Response(http.gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)
