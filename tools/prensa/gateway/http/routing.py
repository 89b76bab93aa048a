"""HTTP plumbing every API's routes share: the request type routes take (gateway state, request
context, orjson bodies), body validation as FastAPI's, orjson responses with timing headers, and a
route class that counts every request under TEI's metric names."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, TypeVar, cast, get_origin, get_type_hints

import orjson
from fastapi import Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Discriminator, TypeAdapter, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from prensa.gateway.core.request_context import PRIORITY_HEADER, RequestContext
from prensa.gateway.errors import ErrorShape
from prensa.gateway.logs import CONTEXT_KEY, ID_KEY, RECEIVED_KEY
from prensa.gateway.state import Gateway, record_success, timing_headers
from prensa.gateway.tracing import stage

# `?model=` on every inference route; the body's `model` field says the same (see `core.registry.named_model`).
ModelParam = Annotated[
    str | None, Query(description="Served model; default: --default-model or the first that fits.")
]

M = TypeVar("M", bound=BaseModel)
# In the ASGI scope's "state": the parsed JSON body, whose fields tell its dialect on a path several
# vendors share (`apis.dialects`), also when it fails
BODY_KEY = "json_body"


def validate_body(request_model: type[M], data: Any) -> M:
    """`data` (parsed JSON) as `request_model`, or pydantic's errors located under "body", as FastAPI
    raises them: for a route that picks its request model from the body itself."""
    try:
        return request_model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        ) from None


def json_response(payload: Any, context: RequestContext | None = None) -> Response:
    """orjson straight from numpy arrays; TEI's timing headers when the request reached Triton."""
    headers = timing_headers(context) if context is not None else {}
    with stage("serialize"):
        body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=headers)


class GatewayRequest(Request):
    """The request as the routes take it (a parameter of this type, which FastAPI fills with the
    request itself: two dependencies fewer to solve per request; docs/performance.md has the
    cost). It reaches the gateway's state and this request's context, and
    parses bodies with orjson: strict UTF-8 (a lone surrogate escape such as "\\ud800" is
    malformed JSON, not a text that fails later) and a nesting limit (1024) instead of a
    RecursionError. Its errors are `json.JSONDecodeError`s, which FastAPI turns into our 400."""

    @property
    def gateway(self) -> Gateway:
        return cast(Gateway, self.app.state.gateway)

    @cached_property
    def context(self) -> RequestContext:
        """This request's context, from when `logs.RequestLog` saw it arrive; also left in the
        request's state for its log line."""
        context = RequestContext(
            received=getattr(self.state, RECEIVED_KEY),
            request_id=getattr(self.state, ID_KEY),
            client=connection_of(self.scope),
        )
        setattr(self.state, CONTEXT_KEY, context)
        if self.gateway.settings.priority:
            context.read_priority(self.headers.get(PRIORITY_HEADER))
        return context

    async def json(self) -> Any:
        if not hasattr(self, "_orjson"):
            self._orjson = orjson.loads(await self.body())
            remember_body(self, self._orjson)
        return self._orjson


def connection_of(scope: Scope) -> str:
    """The client connection a request came on, "host:port" (empty where the server names none)."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


def remember_body(request: Request, data: Any) -> None:
    """Keep the parsed body in the request's state (BODY_KEY): only an error reads its fields."""
    setattr(request.state, BODY_KEY, data)


def given_keys(data: Any) -> Collection[str]:
    """The names a parsed JSON body gives a value (null is none, as vendors read it); none for a
    body that is not an object."""
    return [k for k, v in data.items() if v is not None] if isinstance(data, dict) else ()


def body_fields(request: Request) -> Collection[str]:
    """`given_keys` of the request's body, once parsed; none before."""
    return given_keys(getattr(request.state, BODY_KEY, None))


def is_body(hint: Any) -> bool:
    """Whether a parameter's type is a JSON body: a pydantic model, or a union of them tagged by a
    discriminator (a path several dialects share, `apis.shared`)."""
    if isinstance(hint, type):
        return issubclass(hint, BaseModel)
    return get_origin(hint) is Annotated and any(
        isinstance(meta, Discriminator) for meta in hint.__metadata__
    )


class GatewayRoute(APIRoute):
    """Hands the endpoint a `GatewayRequest`. A route that takes only a JSON body, the request and
    `?model=` (every inference route) can also be run without FastAPI (`run_direct`, see
    `DirectRoutes`), its body parsed and validated as FastAPI does it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def serve(request: Request) -> Response:
            return await self.serve(handler, GatewayRequest(request.scope, request.receive))

        return serve

    async def serve(
        self,
        handler: Callable[[GatewayRequest], Coroutine[Any, Any, Response]],
        request: GatewayRequest,
    ) -> Response:
        return await handler(request)

    @cached_property
    def direct_call(self) -> DirectCall | None:
        """How `run_direct` calls the endpoint, read from its signature (public Python, not
        FastAPI's dependency model): POST only, one pydantic body, the request, at most `?model=`."""
        if self.methods != {"POST"}:
            return None
        hints = get_type_hints(self.endpoint, include_extras=True)
        parameters = list(inspect.signature(self.endpoint).parameters)
        bodies = [name for name in parameters if is_body(hints.get(name))]
        requests = [
            name
            for name in parameters
            if isinstance(hints.get(name), type) and issubclass(hints[name], Request)
        ]
        others = set(parameters) - {*bodies, *requests}
        if len(bodies) != 1 or len(requests) != 1 or not others <= {MODEL_QUERY}:
            return None
        return DirectCall(bodies[0], TypeAdapter(hints[bodies[0]]), requests[0], bool(others))

    @property
    def direct(self) -> bool:
        return self.direct_call is not None

    async def run_direct(self, request: GatewayRequest) -> Response:
        """The endpoint on the request's body, read as FastAPI reads it (orjson, then the body
        model's validation with FastAPI's options; errors located under "body") but without its
        per-request machinery."""
        call = self.direct_call
        assert call is not None, "DirectRoutes takes direct routes only"
        raw = await request.body()
        if not raw:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            )
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", exc.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": exc.msg},
                    }
                ],
                body=exc.doc,
            ) from exc
        remember_body(request, data)
        try:
            body = call.body_type.validate_python(data, from_attributes=True)
        except ValidationError as exc:
            errors = [
                {**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)
            ]
            raise RequestValidationError(errors, body=data) from None
        arguments = {call.body: body, call.request: request}
        if call.model_query:  # most requests have no query string: no parsing then
            arguments[MODEL_QUERY] = (
                request.query_params.get(MODEL_QUERY) if request.scope["query_string"] else None
            )
        return cast(Response, await self.endpoint(**arguments))


@dataclass(frozen=True)
class DirectCall:
    """The parameters a direct route's endpoint takes (`GatewayRoute.direct_call`)."""

    body: str
    body_type: TypeAdapter[Any]
    request: str
    model_query: bool


SharedShape = Callable[[str, Collection[str]], ErrorShape | None]


class ErrorShapes:
    """The error body each path answers: on a path several dialects share, what `shared` says of the
    body's fields (`apis.dialects.error_shape`); elsewhere the shape of the error model its route
    declares in its OpenAPI `responses` (a model with a `shape`, see `errors.ErrorShape`); TEI's
    for a path no route serves. What clients read in the schema is what they get."""

    def __init__(
        self, routes: Iterable[Any], shared: SharedShape = lambda path, fields: None
    ) -> None:
        self.shared = shared
        self.exact: dict[str, ErrorShape] = {}
        self.patterns: list[tuple[Any, ErrorShape]] = []  # routes with path parameters
        for route in routes:
            if not isinstance(route, APIRoute):
                continue
            shape = declared_shape(route)
            if route.param_convertors:
                self.patterns.append((route.path_regex, shape))
            else:
                self.exact.setdefault(route.path, shape)

    def __call__(self, path: str, fields: Collection[str] = ()) -> ErrorShape:
        if (shape := self.shared(path, fields)) is not None:
            return shape
        if (shape := self.exact.get(path)) is not None:
            return shape
        return next(
            (shape for pattern, shape in self.patterns if pattern.match(path)), ErrorShape.TEI
        )


def declared_shape(route: APIRoute) -> ErrorShape:
    """The shape of the error model `route` declares, TEI's when it declares none."""
    shapes = (getattr(spec.get("model"), "shape", None) for spec in route.responses.values())
    return next((shape for shape in shapes if isinstance(shape, ErrorShape)), ErrorShape.TEI)


MODEL_QUERY = "model"  # the query parameter every inference route takes (`ModelParam`)
ErrorHandler = Callable[[Request, Any], Coroutine[Any, Any, Response]]


class DirectRoutes:
    """ASGI: POST requests to `routes` run their `GatewayRoute.run_direct` here, the rest go to
    `app` (FastAPI). FastAPI's per-request work (its middleware, routing over every route,
    dependency solving) is most of the gateway's own CPU on a short query; its error handling is
    kept: the app's `handlers` answer the exceptions they are registered for (looked up along the
    exception's classes, as Starlette does), and anything else is the bare 500 FastAPI answers,
    raised again for the server to log."""

    def __init__(
        self, app: ASGIApp, routes: dict[str, GatewayRoute], handlers: dict[type, ErrorHandler]
    ) -> None:
        self.app = app
        self.routes = routes
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        request = GatewayRequest(scope, receive)
        try:
            response = await route.serve(route.run_direct, request)
        except Exception as exc:  # answered by its handler, else the bare 500 and raised again
            handler = next(
                (self.handlers[kind] for kind in type(exc).__mro__ if kind in self.handlers), None
            )
            if handler is None:
                await PlainTextResponse("Internal Server Error", status_code=500)(
                    scope, receive, send
                )
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)


class CountedRoute(GatewayRoute):
    """Counts requests and successes per route (`method` label = the route's name) and times them."""

    async def serve(
        self,
        handler: Callable[[GatewayRequest], Coroutine[Any, Any, Response]],
        request: GatewayRequest,
    ) -> Response:
        metrics = request.gateway.metrics
        metrics.started(self.name)
        response = await handler(request)
        if response.status_code < 400:
            record_success(metrics, self.name, request.context)
        return response
