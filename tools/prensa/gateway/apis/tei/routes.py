"""TEI's native routes (HTTP only: parse, call the service, shape the JSON).

TEI serves one model; prensa serves several. Every route takes the model from `?model=` or the
body's `model` field; without either a route uses `--default-model` when that model can answer
it, else the first served model (by name) that can. `/embed_colbert` is prensa's own: bge-m3
multi-vectors. Each inference route is an `Operation`, so TEI's default routes (`POST /`,
`/invocations`, `/vertex`) run the very same work, chosen by the body and the model's task.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, RootModel
from tokenizers import Tokenizer

from prensa.gateway.apis.common import activated, asked_chunking, cut_side
from prensa.gateway.apis.dialects import VLLM_PAIR_FIELDS, Dialect, dialect_of, given_fields
from prensa.gateway.apis.errors import TEI_ERRORS, VLLM_ERRORS
from prensa.gateway.apis.m3.answers import embed_m3_payload
from prensa.gateway.apis.m3.protocol import M3Request, ScoreRequest
from prensa.gateway.apis.m3.routes import vllm_scores
from prensa.gateway.apis.openai.protocol import EmbeddingRequest
from prensa.gateway.apis.openai.routes import embeddings_payload
from prensa.gateway.apis.tei.protocol import (
    ClassifyRequest,
    ColbertRequest,
    DecodeRequest,
    EmbedRequest,
    InfinityClassifications,
    InfinityRerank,
    Info,
    ModelRequest,
    PoolingRequest,
    Prediction,
    PredictRequest,
    Rank,
    RerankRequest,
    SimilarityRequest,
    SimpleToken,
    SparseValue,
    TokenizeRequest,
    TokenLevelRequest,
    VertexRequest,
    VertexResponse,
    VllmClassifications,
    VllmPoolings,
    VllmTokens,
)
from prensa.gateway.core.asks import (
    ColbertAsk,
    DenseAsk,
    HiddenAsk,
    RelevanceAsk,
    ScoresAsk,
    SparseAsk,
)
from prensa.gateway.core.encodings import base64_vector
from prensa.gateway.core.engine import gather
from prensa.gateway.core.prompts import prompted
from prensa.gateway.core.registry import Capability, ServedModel, named_model
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
    validate_body,
)
from prensa.gateway.logs import ERROR_KEY
from prensa.gateway.state import Gateway, record_success
from prensa.manifest import Task
from prensa.stages import contract

# read once: importlib.metadata scans site-packages on every call
PRENSA_VERSION = version("prensa")

router = APIRouter(route_class=CountedRoute, responses=TEI_ERRORS, tags=["TEI"])
open_router = APIRouter(route_class=GatewayRoute, tags=["operations"])
# `/`, `/invocations`, `/vertex`: counted per operation they run, as TEI counts them.
default_router = APIRouter(route_class=GatewayRoute, responses=TEI_ERRORS, tags=["TEI"])


@dataclass(frozen=True)
class Operation:
    """One inference route's work: its body, what it needs of a model, and the JSON it answers."""

    name: str  # the route's name, and its `method` label in the metrics
    request: type[BaseModel]
    capability: Capability | None  # None: any model, the operation tells them apart
    run: Callable[[Any, Gateway, ServedModel, RequestContext], Awaitable[Any]]
    # what the body asks of a model, where that depends on the body (in place of `capability`)
    needs: Callable[[Any], Capability] | None = None

    async def answer(self, request: Any, http: GatewayRequest, query_model: str | None) -> Any:
        """The payload for `request`, on the model it names (or the default one)."""
        gw = http.gateway
        capability = self.needs(request) if self.needs else self.capability
        served = await gw.registry.pick(capability, named_model(query_model, request.model))
        return await self.run(request, gw, served, http.context)


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


def ranked_labels(
    values: npt.NDArray[Any], labels: Sequence[str], top_k: int | None = None
) -> list[list[dict[str, Any]]]:
    """Per row, `{score, label}` of its `top_k` (default all) labels, best first, ties in label order."""
    return [
        [
            {"score": row[j], "label": labels[j]}
            for j in np.argsort(-np.asarray(row), kind="stable").tolist()[:top_k]
        ]
        for row in values.tolist()
    ]


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


def text_list(inputs: str | list[str]) -> list[str]:
    """vLLM's and Infinity's `input`: a text, or a list of texts."""
    return [inputs] if isinstance(inputs, str) else list(inputs)


async def _classify(
    request: ClassifyRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """vLLM's `/classify` answer, or Infinity's for a body with `raw_scores` (see `ClassifyRequest`)."""
    texts = text_list(request.input)
    truncation = gw.service.windowed(
        served, truncate=None, direction=cut_side(request), window=request.truncate_prompt_tokens
    )
    raw = not activated(request.raw_scores, request)
    scored = await gw.service.run(
        ScoresAsk(
            model=served,
            items=list(texts),
            pairs=[None] * len(texts),
            truncation=truncation,
            raw_scores=raw,
        ),
        context,
    )
    values, labels, counted = scored.values, served.id2label, int(scored.num_tokens.sum())
    answer = {
        "model": served.name,
        "id": f"classify-{uuid.uuid4().hex}",
        "created": int(time.time()),
    }
    if dialect_of(CLASSIFY_PATH, given_fields(request)) is Dialect.INFINITY:
        return {
            **answer,
            "object": "classify",
            "data": ranked_labels(values, labels),
            "usage": {"prompt_tokens": counted, "total_tokens": counted},
        }
    rows = [
        {"index": i, "label": labels[int(np.argmax(row))], "probs": row, "num_classes": len(row)}
        for i, row in enumerate(values.tolist())
    ]
    return {
        **answer,
        "object": "list",
        "data": rows,
        "usage": {"prompt_tokens": counted, "total_tokens": counted, "completion_tokens": 0},
    }


async def _pooling(
    request: PoolingRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    """vLLM's `/pooling`: pooled vectors (`embed`, as `/embed` with normalize) or token vectors (`token_embed`)."""
    # texts only: vLLM's pooling takes no token ids here
    items: list[Item] = [*text_list(request.input)]
    truncation = gw.service.windowed(
        served, truncate=None, direction=cut_side(request), window=request.truncate_prompt_tokens
    )
    if request.task == "token_embed":
        if request.encoding_format != "float":
            raise validation("`encoding_format` base64 is served for `task: embed` only")
        tokens = await gw.service.run(
            HiddenAsk(model=served, items=items, truncation=truncation), context
        )
        data: list[Any] = list(tokens.rows)
        counted = int(tokens.num_tokens.sum())
    else:
        pooled = await gw.service.run(
            DenseAsk(model=served, items=items, truncation=truncation), context
        )
        data = (
            [base64_vector(row, request.embed_dtype, request.endianness) for row in pooled.rows]
            if request.encoding_format == "base64"
            else list(pooled.rows)
        )
        counted = int(pooled.num_tokens.sum())
    return {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": served.name,
        "data": [{"index": i, "object": "pooling", "data": value} for i, value in enumerate(data)],
        "usage": {"prompt_tokens": counted, "total_tokens": counted, "completion_tokens": 0},
    }


def rerank_passages(request: RerankRequest) -> tuple[list[str], bool]:
    """The passages and whether the body is vLLM's and Infinity's (`documents`) rather than TEI's
    (`texts`); each shape's echo flag belongs to it alone."""
    if (request.texts is None) == (request.documents is None):
        raise validation(
            "give `texts` (TEI's body) or `documents` (vLLM's and Infinity's), one of them"
        )
    if request.documents is not None:
        if request.return_text:
            raise validation(
                "`return_text` goes with `texts`; with `documents` use `return_documents`"
            )
        return request.documents, True
    if request.return_documents:
        raise validation("`return_documents` goes with `documents`; with `texts` use `return_text`")
    return cast("list[str]", request.texts), False


async def _rerank(
    request: RerankRequest, gw: Gateway, served: ServedModel, context: RequestContext
) -> Any:
    passages, shared = rerank_passages(request)
    direction = cut_side(
        request, request.truncation_direction, "truncation_direction" in request.model_fields_set
    )
    truncation = gw.service.windowed(
        served,
        truncate=request.truncate,
        direction=direction,
        window=request.truncate_prompt_tokens,
        pairs=served.scores_pairs,
    )
    raw_said = request.raw_scores if "raw_scores" in request.model_fields_set else None
    scores, used = await document_scores(
        gw.service,
        RelevanceAsk(
            model=served,
            query=request.query,
            texts=list(passages),
            truncation=truncation,
            raw_scores=not activated(raw_said, request),
            weights=request.weights,
            instruction=request.instruction,
        ),
        context,
        max_tokens=request.max_tokens_per_doc,
    )
    order = np.argsort(-scores, kind="stable").tolist()[: request.top_n]
    # Infinity's strings where the body or the operator says so; vLLM's objects otherwise
    strings = request.return_documents and (
        dialect_of(RERANK_PATH, given_fields(request)) is Dialect.INFINITY
        or gw.settings.rerank_document_strings
    )
    if shared:
        return {
            "object": "rerank",
            "model": served.name,
            "id": f"rerank-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "usage": {"prompt_tokens": used, "total_tokens": used},
            "results": [
                {
                    "relevance_score": float(scores[i]),
                    "index": i,
                    "document": passages[i] if strings else {"text": passages[i]},
                }
                for i in order
            ],
        }
    return [
        {
            "index": i,
            "score": float(scores[i]),
            **({"text": passages[i]} if request.return_text else {}),
        }
        for i in order
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
CLASSIFY = Operation("classify", ClassifyRequest, Capability.PREDICT, _classify)
POOLING = Operation(
    "pooling",
    PoolingRequest,
    Capability.DENSE,
    _pooling,
    lambda request: Capability.HIDDEN if request.task == "token_embed" else Capability.DENSE,
)
RERANK = Operation("rerank", RerankRequest, Capability.RERANK, _rerank)
SIMILARITY = Operation("similarity", SimilarityRequest, Capability.DENSE, _similarity)
# What `POST /` runs for a model of each task when the body does not say (TEI: by model type).
# vLLM's bodies on `/invocations` (and `/`): its embeddings and its pair scores
EMBEDDINGS = Operation("openai_embeddings", EmbeddingRequest, Capability.DENSE, embeddings_payload)
SCORE = Operation("score", ScoreRequest, None, vllm_scores)
DEFAULT_OPERATION = {
    "embed": EMBED,
    "m3": EMBED,
    "splade": EMBED_SPARSE,
    "late": EMBED_COLBERT,
    "rerank": PREDICT,
    "classify": PREDICT,
}


async def _serve(
    operation: Operation, request: ModelRequest, http: GatewayRequest, model: str | None
) -> Response:
    return json_response(await operation.answer(request, http, model), http.context)


@router.post("/embed", response_model=list[list[float]], summary="Dense embeddings")
async def embed(request: EmbedRequest, http: GatewayRequest, model: ModelParam = None) -> Response:
    return await _serve(EMBED, request, http, model)


@router.post(
    "/embed_sparse", response_model=list[list[SparseValue]], summary="Sparse (lexical) embeddings"
)
async def embed_sparse(
    request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """bge-m3's sparse head or a SPLADE model: non-zero vocabulary weights, ascending ids."""
    return await _serve(EMBED_SPARSE, request, http, model)


@router.post(
    "/embed_all", response_model=list[list[list[float]]], summary="Per-token hidden states"
)
async def embed_all(
    request: TokenLevelRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """The encoder's last hidden state for every token (special tokens included), no pooling."""
    return await _serve(EMBED_ALL, request, http, model)


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
    return await _serve(EMBED_COLBERT, request, http, model)


@router.post(
    "/predict",
    response_model=list[Prediction] | list[list[Prediction]],
    summary="Classify texts or pairs",
)
async def predict(
    request: PredictRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Classifiers take texts or pairs; rerankers score pairs, and a lone text as a sequence of its own."""
    return await _serve(PREDICT, request, http, model)


CLASSIFY_PATH, RERANK_PATH, TOKENIZE_PATH = "/classify", "/rerank", "/tokenize"
INVOCATIONS_PATH = "/invocations"  # SageMaker's, where vLLM's bodies come too (as `/`)


@router.post(
    CLASSIFY_PATH,
    response_model=VllmClassifications | InfinityClassifications,
    summary="Classify texts (vLLM's body and answer, or Infinity's with `raw_scores`)",
)
async def classify(
    request: ClassifyRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """One label distribution per input; a body with Infinity's `raw_scores` gets Infinity's answer."""
    return await _serve(CLASSIFY, request, http, model)


@router.post(
    "/pooling",
    response_model=VllmPoolings,
    responses=VLLM_ERRORS,
    summary="vLLM's pooling: pooled or per-token vectors",
)
async def pooling(
    request: PoolingRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """`task: embed` gives each input's pooled, L2-normalised vector; `token_embed` every token's."""
    return await _serve(POOLING, request, http, model)


@router.post(
    RERANK_PATH,
    response_model=list[Rank] | InfinityRerank,
    response_model_exclude_none=True,
    summary="Rerank passages (TEI's body, or Infinity's with `documents`)",
)
async def rerank(
    request: RerankRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    return await _serve(RERANK, request, http, model)


@router.post(
    "/similarity", response_model=list[float], summary="Cosine similarity to a source sentence"
)
async def similarity(
    request: SimilarityRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    return await _serve(SIMILARITY, request, http, model)


class JsonObject(RootModel[dict[str, Any]]):
    """Any JSON object: the body of a route that picks its operation from the body itself."""


async def _dispatch(body: dict[str, Any], http: GatewayRequest, query_model: str | None) -> Any:
    """Run the operation TEI's default route would run for `body` and return its payload: rerank for a
    query with texts, similarity for a source sentence, else what the model's task serves."""
    gw = http.gateway
    name = named_model(
        query_model, body.get("model") if isinstance(body.get("model"), str) else None
    )
    if "query" in body and ("texts" in body or "documents" in body):
        operation = RERANK
    elif isinstance(body.get("inputs"), dict):
        operation = SIMILARITY
    elif VLLM_PAIR_FIELDS.intersection(body):
        operation = SCORE
    elif dialect_of(INVOCATIONS_PATH, body.keys()) is Dialect.VLLM:  # embeddings or classification
        task = (await gw.registry.pick(None, name)).task
        operation = EMBEDDINGS if task in (Task.EMBED, Task.M3) else CLASSIFY
    else:
        operation = DEFAULT_OPERATION[(await gw.registry.pick(None, name)).task]
    gw.metrics.started(operation.name)  # before parsing, as CountedRoute counts the named routes
    request = validate_body(operation.request, body)
    payload = await operation.answer(request, http, query_model)
    record_success(gw.metrics, operation.name, http.context)
    return payload


@default_router.post("/", summary="TEI's default route: the chosen model's own operation")
@default_router.post(INVOCATIONS_PATH, include_in_schema=False)
async def default_route(
    request: JsonObject, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """embed for embedders and bge-m3, embed_sparse for SPLADE, predict for classifiers and rerankers
    (rerank when the body has `query` and `texts` or `documents`, similarity when `inputs` is a
    source sentence with sentences). vLLM's bodies, told apart by their fields as vLLM's own
    `/invocations` tells them: `/score`'s for `text_1` and its other names, `/v1/embeddings`' (an
    embedder) or `/classify`'s (any other model) for `input`. The model from `?model=`, the body's
    `model` or the default one."""
    return json_response(await _dispatch(request.root, http, model), http.context)


async def vertex(
    request: VertexRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Google Vertex AI's shape: each instance is a body for `POST /`, each prediction its answer."""
    if not request.instances:
        raise GatewayError(ErrorKind.EMPTY, "`instances` cannot be empty")
    predictions = await gather([_dispatch(instance, http, model) for instance in request.instances])
    return json_response({"predictions": predictions}, http.context)


VERTEX_ROUTE = "/vertex"
default_router.add_api_route(
    VERTEX_ROUTE,
    vertex,
    methods=["POST"],
    response_model=VertexResponse,
    summary="Vertex AI: instances in, predictions out",
)


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


def _vllm_tokens(
    tokenizer: Tokenizer, text: str, add_special_tokens: bool, strings: bool, max_length: int
) -> Response:
    """vLLM's `/tokenize` answer, built in a thread: `text` as the model reads it."""
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return json_response(
        {
            "count": len(encoding.ids),
            "max_model_len": max_length,
            "tokens": encoding.ids,
            "token_strs": encoding.tokens if strings else None,
        }
    )


@router.post(
    TOKENIZE_PATH,
    response_model=list[list[SimpleToken]] | VllmTokens,
    summary="Tokenize with the model's tokenizer (TEI's body, or vLLM's with `prompt`)",
)
async def tokenize(
    request: TokenizeRequest, http: GatewayRequest, model: ModelParam = None
) -> Response:
    gw = http.gateway
    served = await gw.registry.pick(None, named_model(model, request.model))
    if (request.inputs is None) == (request.prompt is None):
        raise validation("give `inputs` (TEI's body) or `prompt` (vLLM's), one of them")
    if request.prompt is None and request.return_token_strs:
        raise validation("`return_token_strs` goes with vLLM's `prompt`")
    vllm = dialect_of(TOKENIZE_PATH, given_fields(request)) is Dialect.VLLM
    given = cast("str | list[str]", request.prompt if vllm else request.inputs)
    texts = [given] if isinstance(given, str) else given
    # texts stay texts
    texts = cast("list[str]", prompted(served, gw.settings, list(texts), request.prompt_name))
    gw.service.check_batch(len(texts))  # the batch limit answers first (422), as on every route
    limit = gw.service.tokenize_limit(served)
    characters = sum(map(len, texts))
    # more tokens than the limit for sure: refused before tokenizing
    if characters > limit * served.longest_token:
        raise too_many_tokens(
            limit,
            f"{characters} characters, and no token of the model is longer than "
            f"{served.longest_token}",
        )
    if vllm:
        return await gw.service.tokenizer_work(
            1,
            _vllm_tokens,
            served.require_tokenizer(),
            contract.read_text(texts[0], served.strip_texts),
            request.add_special_tokens,
            request.return_token_strs,
            served.max_length,
        )
    return await gw.service.tokenizer_work(
        len(texts),
        _tokens,
        served.require_tokenizer(),
        texts,
        request.add_special_tokens,
        limit,
        served.strip_texts,
    )


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


# /info's pooling for the tasks that answer per-token weights or vectors rather than a pooled one
TOKEN_POOLINGS = {Task.SPLADE: "splade", Task.LATE: "colbert"}


def model_info(model: ServedModel) -> dict[str, object]:
    labels = {str(i): label for i, label in enumerate(model.id2label)}
    kinds = {"rerank": "reranker", "classify": "classifier"}
    model_type = (
        {
            kinds[model.task]: {
                "id2label": labels,
                "label2id": {v: int(k) for k, v in labels.items()},
            }
        }
        if model.task in kinds
        else {"embedding": {"pooling": TOKEN_POOLINGS.get(model.task, model.pooling)}}
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
