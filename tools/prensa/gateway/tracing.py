"""OpenTelemetry traces of the gateway's requests, continued inside Triton.

With `--otlp-endpoint` set, `Traced` (the ASGI layer inside `RequestLog`) opens one server span per
request, and `rpc_span` one per TEI gRPC call, a child of the client's W3C `traceparent` when it
sends one; the request's stages open children of it through `stage`, `past_stage` and
`model_call`: parse and validate, tokenize, each Triton call, serialize. A Triton call sends its span's `traceparent` (`triton_headers`), which Triton's own
OpenTelemetry tracing (started by `prensa serve`, see `prensa.triton.tracing`) takes as the parent
of its spans, so one trace holds the gateway's stages and Triton's models, queues and computes.

The sampler follows a client's sampling decision and samples `--otlp-sample-rate` of the requests
that bring none. A request left out, and every request while no endpoint is set, opens no stage
span and sends Triton no `traceparent`: then `stage` costs one context-variable read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prensa.gateway.logs import CONTEXT_KEY, ERROR_KEY, ID_KEY, RECEIVED_KEY, TRACE_KEY

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from prensa.gateway.settings import GatewaySettings

TRACES_PATH = "/v1/traces"  # where an OTLP/HTTP collector takes spans
PROPAGATOR = TraceContextTextMapPropagator()
# The tracer while a sampled request runs (contextvars follow it into tasks and threads), else None.
ACTIVE: ContextVar[Tracer | None] = ContextVar("prensa_active_tracer", default=None)


def provider(settings: GatewaySettings) -> TracerProvider:
    """A tracer provider batching spans to the settings' OTLP collector. Imported here: a gateway
    that does not trace never loads the SDK and its exporters."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    assert settings.otlp_endpoint, "tracing needs an endpoint"
    endpoint = settings.otlp_endpoint.rstrip("/")
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter: Any = GrpcExporter(
            endpoint=endpoint, insecure=not endpoint.startswith("https://")
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(
            endpoint=endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH
        )
    traces = TracerProvider(
        resource=Resource.create({SERVICE_NAME: settings.otlp_service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.otlp_sample_rate)),
    )
    traces.add_span_processor(BatchSpanProcessor(exporter))
    return traces


def stage(
    name: str, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any
) -> AbstractContextManager[Any]:
    """A child span of the current one around a stage of a sampled request; nothing otherwise."""
    tracer = ACTIVE.get()
    if tracer is None:
        return nullcontext()
    return tracer.start_as_current_span(name, kind=kind, attributes=attributes)


def model_call(
    name: str, model: str, inputs: Mapping[str, Any], kind: SpanKind, **attributes: Any
) -> AbstractContextManager[Any]:
    """`stage` around one call of a backend's model: every call of every request passes here, so
    the span's attributes are built only for a sampled request."""
    tracer = ACTIVE.get()
    if tracer is None:
        return nullcontext()
    rows = len(next(iter(inputs.values()))) if inputs else 0
    return tracer.start_as_current_span(
        name,
        kind=kind,
        attributes={"prensa.triton_model": model, "prensa.rows": rows, **attributes},
    )


def wall_ns(since: float) -> int:
    """A perf_counter reading as the Unix time in nanoseconds that spans take."""
    return time.time_ns() - int((time.perf_counter() - since) * 1e9)


def past_stage(name: str, since: float, **attributes: Any) -> None:
    """A child span for a stage that ran from `since` (a perf_counter reading) until now, for stages
    no code wraps, such as FastAPI's parsing and validation of the body."""
    tracer = ACTIVE.get()
    if tracer is None:
        return
    # `since` may precede the request's own span by a few hundred nanoseconds (it is read first, and
    # the two clocks convert with jitter): a child never starts before its parent.
    parent_start = getattr(get_current_span(), "start_time", None) or 0
    tracer.start_span(
        name, start_time=max(wall_ns(since), parent_start), attributes=attributes
    ).end()


def sampled() -> bool:
    """Whether the current request is traced."""
    return ACTIVE.get() is not None


def triton_headers() -> dict[str, str] | None:
    """The current span's `traceparent` for a Triton call of a sampled request, else None."""
    if ACTIVE.get() is None:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


@contextmanager
def server_span(
    tracer: Tracer | None,
    name: str,
    carrier: Mapping[str, str],
    start_ns: int | None,
    attributes: Mapping[str, str] | None = None,
) -> Iterator[Span | None]:
    """A server span from `start_ns`, parented on the client's W3C headers (`carrier`), current
    (and `ACTIVE`) while it is open, so the request's stages open children of it; None when not
    traced (no tracer, or the sampler left the request out)."""
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        name,
        context=PROPAGATOR.extract(carrier),
        start_time=start_ns,
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if not span.is_recording():
            yield None
            return
        active = ACTIVE.set(tracer)
        try:
            yield span
        finally:
            ACTIVE.reset(active)


def rpc_span(
    tracer: Tracer | None, rpc: str, carrier: Mapping[str, str], since: float
) -> AbstractContextManager[Span | None]:
    """`server_span` of one gRPC call (`rpc`, such as "/tei.v1.Embed/Embed") from `since` (a
    perf_counter reading), parented on the client's `traceparent` metadata."""
    name = rpc.lstrip("/")
    service, _, method = name.partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    return server_span(tracer, name, carrier, wall_ns(since), attributes)


class Traced:
    """ASGI middleware: a server span per request from its arrival (`RequestLog`'s stamp), parented
    on the client's `traceparent`; probes and documentation (`untraced` paths) get none."""

    def __init__(self, app: ASGIApp, tracer: Tracer, untraced: frozenset[str]) -> None:
        self.app = app
        self.tracer = tracer
        self.untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.untraced:
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        method, path = scope["method"], scope["path"]
        state = scope.setdefault("state", {})
        arrived = wall_ns(state[RECEIVED_KEY]) if RECEIVED_KEY in state else None
        with server_span(self.tracer, f"{method} {path}", carrier, arrived) as span:
            if span is None:
                await self.app(scope, receive, send)
                return
            state[TRACE_KEY] = format(span.get_span_context().trace_id, "032x")
            status = 500

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                with_route = scope.get("route")
                route = getattr(with_route, "path", path)
                span.update_name(f"{method} {route}")
                span.set_attributes(
                    {
                        "http.request.method": method,
                        "url.path": path,
                        "http.route": route,
                        "http.response.status_code": status,
                        "prensa.request_id": state.get(ID_KEY, ""),
                    }
                )
                if (context := state.get(CONTEXT_KEY)) is not None:
                    span.set_attributes(
                        {
                            "prensa.model": context.model,
                            "prensa.inputs": context.inputs,
                            "prensa.tokens": context.tokens,
                        }
                    )
                if status >= 500:
                    span.set_status(StatusCode.ERROR, str(state.get(ERROR_KEY, "")))
