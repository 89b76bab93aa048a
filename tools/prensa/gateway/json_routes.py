"""The inference routes (JSON body in, JSON out), run without FastAPI's per-request machinery.

FastAPI declares every route (the OpenAPI schema, /docs, the route table) and serves all but
these. An endpoint taking one request model, the `GatewayRequest` and optionally `model` (the
`?model=` query parameter) -- every TEI and OpenAI inference route -- is run here, right behind
the Guard (see `GatewayApp`): its body parsed as `GatewayRequest.json` parses it, validated by its
model with the error records FastAPI would raise (so the same 400/422 bodies), counted by its
route class, and its errors answered by the app's own handlers. FastAPI's middleware, router,
exit stacks and dependency solver took about half a millisecond of a lone short query's 10.5 ms
through the gateway on the 2-core reference machine (issue 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast, get_type_hints

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from prensa.gateway.responses import GatewayRequest, GatewayRoute

MODEL_PARAMETER = "model"


M = TypeVar("M", bound=BaseModel)


def validate_body(request_model: type[M], data: Any) -> M:
    """`data` (parsed JSON) as `request_model`, or pydantic's errors located under "body", as FastAPI
    raises them."""
    try:
        return request_model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None


async def parse_body(http: GatewayRequest, request_model: type[M]) -> M:
    """The body as `request_model`, or the `RequestValidationError` FastAPI would raise: no body,
    JSON that does not parse, pydantic's errors located under "body"."""
    if not await http.body():
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        data = await http.json()
    except orjson.JSONDecodeError as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": exc.msg}}]) from None
    return validate_body(request_model, data)


@dataclass(frozen=True)
class JsonEndpoint:
    """A route's endpoint and the names of the parameters it takes."""

    route: GatewayRoute
    body: str
    request_model: type[BaseModel]
    http: str
    takes_model: bool

    @classmethod
    def of(cls, route: BaseRoute) -> JsonEndpoint | None:
        """The endpoint when `route` is a POST route of this shape returning a `Response`, else None
        (FastAPI serves it)."""
        if not isinstance(route, GatewayRoute) or route.methods != {"POST"}:
            return None
        hints = get_type_hints(route.endpoint)
        if hints.pop("return", None) is not Response:  # a model to serialise is FastAPI's job
            return None
        bodies = [n for n, h in hints.items() if isinstance(h, type) and issubclass(h, BaseModel)]
        requests = [n for n, h in hints.items() if h is GatewayRequest]
        rest = set(hints) - {*bodies, *requests}
        if len(bodies) != 1 or len(requests) != 1 or rest - {MODEL_PARAMETER} \
                or (rest and hints[MODEL_PARAMETER] != str | None):
            return None
        return cls(route, bodies[0], hints[bodies[0]], requests[0], bool(rest))

    async def __call__(self, http: GatewayRequest) -> Response:
        """Parse and run: the handler `route.serve` takes."""
        arguments = {self.body: await parse_body(http, self.request_model), self.http: http}
        if self.takes_model:
            arguments[MODEL_PARAMETER] = http.query_params.get(MODEL_PARAMETER)
        return cast(Response, await self.route.endpoint(**arguments))


class JsonRoutes:
    """ASGI middleware: runs the `JsonEndpoint`s of `routes`, passes the rest on to FastAPI.
    `handlers` is the app's exception handlers (looked up by the exception's class, as Starlette does)."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute],
                 handlers: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]]) -> None:
        self.app = app
        self.endpoints = {endpoint.route.path: endpoint for route in routes if (endpoint := JsonEndpoint.of(route))}
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        http = GatewayRequest(scope, receive)
        try:
            response = await endpoint.route.serve(endpoint, http)
        except Exception as exc:
            handler = next((self.handlers[t] for t in type(exc).__mro__ if t in self.handlers), None)
            if handler is None:
                raise  # uvicorn answers 500
            response = await handler(http, exc)
        await response(scope, receive, send)
