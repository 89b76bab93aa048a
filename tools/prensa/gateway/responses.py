"""HTTP plumbing every router shares: the request type routes take (gateway state, timings, orjson
bodies), body validation as FastAPI's, orjson responses with timing headers, and a route class
that counts every request under TEI's metric names."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, TypeVar, cast

import orjson
from fastapi import Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from prensa.gateway.backend import Backend
from prensa.gateway.logs import ID_KEY, RECEIVED_KEY, TIMINGS_KEY
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.models import Registry
from prensa.gateway.service import Service, Timings
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import stage

# `?model=` on every inference route; the body's `model` field says the same (see `models.named_model`).
ModelParam = Annotated[str | None, Query(description="Served model; default: --default-model or the first that fits.")]

M = TypeVar("M", bound=BaseModel)
CHUNKS_HEADER = "x-prensa-chunks"


def validate_body(request_model: type[M], data: Any) -> M:
    """`data` (parsed JSON) as `request_model`, or pydantic's errors located under "body", as FastAPI
    raises them: for a route that picks its request model from the body itself."""
    try:
        return request_model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None


@dataclass
class Gateway:
    """What the routes reach through `GatewayRequest.gateway`, built when the app starts."""

    settings: GatewaySettings
    client: Backend
    registry: Registry
    service: Service
    metrics: GatewayMetrics
    started: float = field(default_factory=time.time)  # Unix time: OpenAI's `created` of every model


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def json_response(payload: Any, timings: Timings | None = None) -> Response:
    """orjson straight from numpy arrays; TEI's timing headers when the request reached Triton."""
    headers = {}
    if timings is not None:
        queue = timings.queue_s or 0.0
        headers = {
            "x-compute-type": "triton",
            "x-compute-time": _ms(timings.tokenization_s + queue + timings.inference_s),
            "x-compute-characters": str(timings.characters),
            "x-compute-tokens": str(timings.tokens),
            "x-total-time": _ms(time.perf_counter() - timings.received),
            "x-tokenization-time": _ms(timings.tokenization_s),
            "x-queue-time": _ms(queue),
            "x-inference-time": _ms(timings.inference_s),
        }
        if timings.chunks is not None:  # windows per input, in order
            headers[CHUNKS_HEADER] = ",".join(map(str, timings.chunks))
    with stage("serialize"):
        body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json", headers=headers)


def record_success(metrics: GatewayMetrics, method: str, timings: Timings) -> None:
    """Count an answered request under `method`, with its time and the parts of it."""
    metrics.succeeded(method, time.perf_counter() - timings.received, timings.tokenization_s, timings.queue_s or 0.0,
                      timings.inference_s)


class GatewayRequest(Request):
    """The request as the routes take it (a parameter of this type, which FastAPI fills with the
    request itself: two dependencies fewer to solve per request, measured at a quarter of a
    millisecond on a lone query). It reaches the gateway's state and this request's timings, and
    parses bodies with orjson: strict UTF-8 (a lone surrogate escape such as "\\ud800" is
    malformed JSON, not a text that fails later) and a nesting limit (1024) instead of a
    RecursionError. Its errors are `json.JSONDecodeError`s, which FastAPI turns into our 400."""

    @property
    def gateway(self) -> Gateway:
        return cast(Gateway, self.app.state.gateway)

    @cached_property
    def timings(self) -> Timings:
        """This request's timings, from when `logs.RequestLog` saw it arrive; also left in the
        request's state for its log line."""
        timings = Timings(received=getattr(self.state, RECEIVED_KEY), request_id=getattr(self.state, ID_KEY))
        setattr(self.state, TIMINGS_KEY, timings)
        return timings

    async def json(self) -> Any:
        if not hasattr(self, "_orjson"):
            self._orjson = orjson.loads(await self.body())
        return self._orjson


class GatewayRoute(APIRoute):
    """Hands the endpoint a `GatewayRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def serve(request: Request) -> Response:
            return await self.serve(handler, GatewayRequest(request.scope, request.receive))

        return serve

    async def serve(self, handler: Callable[[GatewayRequest], Coroutine[Any, Any, Response]],
                    request: GatewayRequest) -> Response:
        return await handler(request)


class CountedRoute(GatewayRoute):
    """Counts requests and successes per route (`method` label = the route's name) and times them."""

    async def serve(self, handler: Callable[[GatewayRequest], Coroutine[Any, Any, Response]],
                    request: GatewayRequest) -> Response:
        metrics = request.gateway.metrics
        metrics.started(self.name)
        response = await handler(request)
        if response.status_code < 400:
            record_success(metrics, self.name, request.timings)
        return response
