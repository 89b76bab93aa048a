"""The route table of the paths several dialects share: each path's body is one of its dialects'
own bodies, told apart by `dialects.dialect_of` as pydantic validates it (a union tagged by the
body's fields), and runs that dialect's operation. SageMaker's `/invocations` and TEI's `POST /`
pick an operation from the body the same way; `/vertex` runs `POST /` per instance.

A dialect on a shared path is a row in `SHARED` (its body and operation) and its rule in
`dialects.SHARED_PATHS`; nothing else tells dialects apart.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union

from fastapi import APIRouter, Response
from pydantic import BaseModel, Discriminator, RootModel, Tag

from prensa.gateway.apis.dialects import (
    DIALECT_NAMES,
    INVOCATIONS_PATH,
    VLLM_PAIR_FIELDS,
    Dialect,
    dialect_of,
    given_fields,
)
from prensa.gateway.apis.errors import MESSAGE_ERRORS, TEI_ERRORS
from prensa.gateway.apis.infinity import routes as infinity_routes
from prensa.gateway.apis.infinity.protocol import InfinityClassifications, InfinityRerank
from prensa.gateway.apis.m3 import routes as m3_routes
from prensa.gateway.apis.m3.protocol import HybridScore
from prensa.gateway.apis.openai import routes as openai_routes
from prensa.gateway.apis.openai.protocol import EmbeddingResponse, MultiVectorResponse
from prensa.gateway.apis.operation import Operation
from prensa.gateway.apis.tei import routes as tei_routes
from prensa.gateway.apis.tei.protocol import Rank, SimpleToken, VertexRequest, VertexResponse
from prensa.gateway.apis.vllm import routes as vllm_routes
from prensa.gateway.apis.vllm.protocol import (
    VllmClassifications,
    VllmRerank,
    VllmScores,
    VllmTokens,
)
from prensa.gateway.core.engine import gather
from prensa.gateway.core.registry import named_model
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.http.routing import (
    CountedRoute,
    GatewayRequest,
    GatewayRoute,
    ModelParam,
    body_fields,
    given_keys,
    json_response,
    validate_body,
)
from prensa.gateway.state import record_success


@dataclass(frozen=True)
class SharedPath:
    """One shared path: the operation each dialect runs on it."""

    path: str
    operations: dict[Dialect, Operation]

    def dialect(self, fields: Collection[str]) -> Dialect:
        dialect = dialect_of(self.path, fields)
        assert dialect is not None, f"{self.path} has no rule in dialects.SHARED_PATHS"
        return dialect

    def tag(self, body: Any) -> str:
        """The dialect of a body as pydantic sees it: parsed JSON, or a model already."""
        if isinstance(body, BaseModel):
            return self.dialect(given_fields(body)).value
        return self.dialect(given_keys(body)).value

    def body(self) -> Any:
        """The path's body: each dialect's own model, picked by `tag` (the OpenAPI `oneOf`)."""
        tagged = tuple(
            Annotated[operation.request, Tag(dialect.value)]
            for dialect, operation in self.operations.items()
        )
        return Annotated[Union[tagged], Discriminator(self.tag)]  # noqa: UP007 (a runtime tuple)

    @cached_property
    def fields(self) -> dict[Dialect, frozenset[str]]:
        """Each dialect's body's fields, read once: `refuse_foreign` runs on every request."""
        return {d: frozenset(op.request.model_fields) for d, op in self.operations.items()}

    def operation(self, request: BaseModel) -> Operation:
        """The operation of the dialect whose body `request` is."""
        return next(op for op in self.operations.values() if type(request) is op.request)

    def refuse_foreign(self, request: BaseModel, fields: Collection[str]) -> None:
        """Refuse, by name, a field of another dialect's body on this path: the body is read as
        its own dialect's, where that field would be silently ignored."""
        own = type(request).model_fields
        for dialect, theirs in self.fields.items():
            foreign = sorted(theirs.intersection(fields).difference(own))
            if foreign:
                mine = self.dialect(fields)
                raise validation(
                    f"`{foreign[0]}` is a field of {DIALECT_NAMES[dialect]}'s `{self.path}` body, "
                    f"and this one is {DIALECT_NAMES[mine]}'s (by its fields: see docs/api.md); "
                    "give one dialect's fields"
                )

    async def respond(
        self, request: BaseModel, http: GatewayRequest, model: str | None
    ) -> Response:
        self.refuse_foreign(request, body_fields(http))
        return await self.operation(request).respond(request, http, model)


RERANK = SharedPath(
    "/rerank",
    {
        Dialect.TEI: tei_routes.RERANK,
        Dialect.VLLM: vllm_routes.RERANK,
        Dialect.INFINITY: infinity_routes.RERANK,
    },
)
CLASSIFY = SharedPath(
    "/classify", {Dialect.VLLM: vllm_routes.CLASSIFY, Dialect.INFINITY: infinity_routes.CLASSIFY}
)
SCORE = SharedPath("/score", {Dialect.BGE_M3: m3_routes.SCORE, Dialect.VLLM: vllm_routes.SCORE})
TOKENIZE = SharedPath(
    "/tokenize", {Dialect.TEI: tei_routes.TOKENIZE, Dialect.VLLM: vllm_routes.TOKENIZE}
)
EMBEDDINGS = SharedPath(
    "/v1/embeddings",
    {Dialect.OPENAI: openai_routes.EMBEDDINGS, Dialect.VLLM: openai_routes.VLLM_EMBEDDINGS},
)
SHARED = {shared.path: shared for shared in (RERANK, CLASSIFY, SCORE, TOKENIZE, EMBEDDINGS)}

if TYPE_CHECKING:  # a checker sees a body; FastAPI and `DirectRoutes` the dialects' union
    RerankBody: TypeAlias = BaseModel
    ClassifyBody: TypeAlias = BaseModel
    ScoreBody: TypeAlias = BaseModel
    TokenizeBody: TypeAlias = BaseModel
    EmbeddingsBody: TypeAlias = openai_routes.AnyEmbeddingRequest
else:
    RerankBody = RERANK.body()
    ClassifyBody = CLASSIFY.body()
    ScoreBody = SCORE.body()
    TokenizeBody = TOKENIZE.body()
    EmbeddingsBody = EMBEDDINGS.body()

router = APIRouter(route_class=CountedRoute, responses=TEI_ERRORS, tags=["shared paths"])
# `/`, `/invocations`, `/vertex`: counted per operation they run, as TEI counts them.
default_router = APIRouter(route_class=GatewayRoute, responses=TEI_ERRORS, tags=["TEI"])


@router.post(
    RERANK.path,
    response_model=list[Rank] | VllmRerank | InfinityRerank,
    summary="Rerank passages: TEI's body (`texts`), vLLM's (`documents`) or Infinity's "
    "(`documents` with `raw_scores`), each answered in its shape",
)
async def rerank(request: RerankBody, http: GatewayRequest, model: ModelParam = None) -> Response:
    return await RERANK.respond(request, http, model)


@router.post(
    CLASSIFY.path,
    response_model=VllmClassifications | InfinityClassifications,
    summary="Classify texts: vLLM's body, or Infinity's (with `raw_scores`), each answered in its shape",
)
async def classify(
    request: ClassifyBody, http: GatewayRequest, model: ModelParam = None
) -> Response:
    return await CLASSIFY.respond(request, http, model)


@router.post(
    SCORE.path,
    response_model=list[HybridScore] | VllmScores,
    summary="bge-m3's hybrid relevance scores (`query`, `passages`), or vLLM's pair scores "
    "(`text_1`/`text_2` and their other names)",
)
async def score(request: ScoreBody, http: GatewayRequest, model: ModelParam = None) -> Response:
    return await SCORE.respond(request, http, model)


@router.post(
    TOKENIZE.path,
    response_model=list[list[SimpleToken]] | VllmTokens,
    summary="Tokenize with the model's tokenizer: TEI's body (`inputs`) or vLLM's (`prompt`)",
)
async def tokenize(
    request: TokenizeBody, http: GatewayRequest, model: ModelParam = None
) -> Response:
    return await TOKENIZE.respond(request, http, model)


@router.post(
    EMBEDDINGS.path,
    response_model=EmbeddingResponse | MultiVectorResponse,
    responses=MESSAGE_ERRORS,
    summary="OpenAI embeddings: OpenAI's body (with NIM's, Jina's and PyLate's fields) or vLLM's "
    "(with its own options)",
)
@router.post(
    "/embeddings",
    response_model=EmbeddingResponse | MultiVectorResponse,
    responses=MESSAGE_ERRORS,
    include_in_schema=False,
)
async def openai_embeddings(
    request: EmbeddingsBody, http: GatewayRequest, model: ModelParam = None
) -> Response:
    """Dense, L2-normalised vectors (unless vLLM's `normalize: false`); token vectors with Jina's
    `return_multivector`, and on a late-interaction model as PyLate's server answers them."""
    EMBEDDINGS.refuse_foreign(request, body_fields(http))
    return await openai_routes.answer_embeddings(request, http, model)


class JsonObject(RootModel[dict[str, Any]]):
    """Any JSON object: the body of a route that picks its operation from the body itself."""


async def _dispatch(body: dict[str, Any], http: GatewayRequest, query_model: str | None) -> Any:
    """Run the operation TEI's default route would run for `body` and return its payload: rerank for a
    query with texts or documents, similarity for a source sentence, vLLM's bodies by their fields,
    else what the model's task serves; on a shared path's operation, in the body's dialect there."""
    gw = http.gateway
    name = named_model(
        query_model, body.get("model") if isinstance(body.get("model"), str) else None
    )
    fields = given_keys(body)
    shared: SharedPath | None = None
    if "query" in body and ("texts" in body or "documents" in body):
        shared = RERANK
    elif isinstance(body.get("inputs"), dict):
        operation = tei_routes.SIMILARITY
    elif VLLM_PAIR_FIELDS.intersection(body):
        shared = SCORE
    elif dialect_of(INVOCATIONS_PATH, fields) is Dialect.VLLM:  # embeddings or classification
        dense = (await gw.registry.pick(None, name)).layout.dense
        shared = EMBEDDINGS if dense else CLASSIFY
    else:
        operation = tei_routes.default_operation(await gw.registry.pick(None, name))
    if shared is not None:  # the body's dialect on that path, as the path itself reads it
        operation = shared.operations[shared.dialect(fields)]
    gw.metrics.started(operation.name)  # before parsing, as CountedRoute counts the named routes
    request = validate_body(operation.request, body)
    if shared is not None:
        shared.refuse_foreign(request, fields)
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
