"""The FastAPI app factory: routers, middleware, error handlers and the backend's (Triton's) life."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, HTTPExceptionHandler

from prensa.addresses import LOOPBACK
from prensa.gateway.apis import admin, dialects, shared
from prensa.gateway.apis.cohere import routes as cohere_routes
from prensa.gateway.apis.errors import TEI_ERRORS
from prensa.gateway.apis.m3 import routes as m3_routes
from prensa.gateway.apis.nim import routes as nim_routes
from prensa.gateway.apis.ollama import routes as ollama_routes
from prensa.gateway.apis.openai import batches
from prensa.gateway.apis.openai import routes as openai_routes
from prensa.gateway.apis.tei import routes as tei_routes
from prensa.gateway.apis.vllm import routes as vllm_routes
from prensa.gateway.backends.base import Backend, BackendFactory
from prensa.gateway.backends.replicas import ReplicaPool
from prensa.gateway.backends.triton import TritonClient
from prensa.gateway.core.limits import BULK_SHARE, Permits, SharedPermits, UnsentAnswers
from prensa.gateway.core.registry import Registry
from prensa.gateway.core.service import Service
from prensa.gateway.core.shadow import Shadows
from prensa.gateway.errors import ErrorKind, GatewayError, error_body, error_status
from prensa.gateway.http.middleware import OPEN_PATHS, ApiKey, CancelOnHangUp, JsonBody, PacedAnswer
from prensa.gateway.http.routing import DirectRoutes, ErrorShapes, GatewayRoute, body_fields
from prensa.gateway.jobs.runner import JobRunner
from prensa.gateway.jobs.store import JobStore
from prensa.gateway.logs import ERROR_KEY, ID_KEY, RequestLog
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.state import Gateway
from prensa.gateway.tracing import Traced, provider

log = logging.getLogger("prensa.gateway")
# The routers of inference routes (counted under TEI's metrics), beside the model-listing and operational ones.
INFERENCE_ROUTERS = [
    openai_routes.router,
    cohere_routes.router,
    nim_routes.router,
    ollama_routes.router,
    tei_routes.router,
    m3_routes.router,
    vllm_routes.router,
    shared.router,
    shared.default_router,
]
INFERENCE_ROUTES = [route for router in INFERENCE_ROUTERS for route in router.routes]
ROUTERS = [
    *INFERENCE_ROUTERS,
    openai_routes.models_router,
    ollama_routes.models_router,
    tei_routes.open_router,
    batches.router,
    admin.router,
]
# Vertex AI tells a container where to serve predictions and health (TEI honours the same variables).
VERTEX_PREDICT_ROUTE, VERTEX_HEALTH_ROUTE = "AIP_PREDICT_ROUTE", "AIP_HEALTH_ROUTE"


def vertex_router(environ: Mapping[str, str]) -> APIRouter:
    """Vertex AI's routes where its variables put them: predictions as `/vertex`, health as `/health`."""
    router = APIRouter(route_class=GatewayRoute, tags=["Vertex AI"])
    if predict := environ.get(VERTEX_PREDICT_ROUTE):
        router.add_api_route(
            predict,
            shared.vertex,
            methods=["POST"],
            responses=TEI_ERRORS,
            summary=f"Vertex AI predictions (${VERTEX_PREDICT_ROUTE})",
        )
    if health := environ.get(VERTEX_HEALTH_ROUTE):
        router.add_api_route(
            health,
            tei_routes.health,
            methods=["GET"],
            summary=f"Vertex AI health (${VERTEX_HEALTH_ROUTE})",
        )
    return router


def _error_response(request: Request, error: GatewayError) -> Response:
    request.app.state.metrics.request_failure.inc(error.kind.value)
    setattr(request.state, ERROR_KEY, error.message)  # for the request's log line
    shape = cast(GatewayApp, request.app).error_shapes(request.url.path, body_fields(request))
    return Response(
        error_body(error, shape, getattr(request.state, ID_KEY, "")),
        status_code=error_status(error, shape),
        headers=error.headers,
        media_type="application/json",
    )


async def on_gateway_error(request: Request, error: GatewayError) -> Response:
    return _error_response(request, error)


def field_path(loc: Sequence[Any]) -> str:
    """A failed field's place in the body (`inputs.str`): after "body", and after the dialect
    pydantic tags a shared path's body with (`apis.shared`), which is no field of it."""
    parts = list(loc[1:])
    if parts and parts[0] in DIALECT_TAGS:
        parts = parts[1:]
    return ".".join(str(part) for part in parts)


DIALECT_TAGS = frozenset(dialect.value for dialect in dialects.Dialect)


async def on_invalid_request(request: Request, error: RequestValidationError) -> Response:
    """400 for malformed JSON, 422 for missing fields or fields of the wrong type (`middleware.JsonBody`
    already answered 415 to bodies that are not JSON)."""
    problems = error.errors()
    malformed = [p for p in problems if p["type"] == "json_invalid"]
    if malformed:
        reason = malformed[0].get("ctx", {}).get("error", malformed[0]["msg"])
        kind, message = ErrorKind.MALFORMED, f"Failed to parse the request body as JSON: {reason}"
    else:
        details = "; ".join(f"`{field_path(p['loc'])}`: {p['msg']}" for p in problems[:5])
        kind, message = ErrorKind.VALIDATION, f"Input validation error: {details}"
    return _error_response(request, GatewayError(kind, message))


class GatewayApp(FastAPI):
    """FastAPI, which routes every request, behind the gateway's own layers, outermost first: CORS
    (when configured, so preflights never need the key), `RequestLog` (request ids, a log line
    each), `Traced` (with --otlp-endpoint: a span each, see `tracing`), then `middleware`'s
    admission checks (API key, JSON body and its size, cancel on hang-up, paced answers); the
    inference routes then run directly (`routing.DirectRoutes`). An exception nothing handles
    ends as FastAPI's 500."""

    def __init__(
        self,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        vertex: APIRouter,
        direct_routes: bool = True,
        shared_permits: SharedPermits | None = None,
        **kwargs: Any,
    ) -> None:
        # False: every route through FastAPI (the tests' reference)
        self.direct_routes = direct_routes
        super().__init__(**kwargs)
        self.gateway_settings = settings
        self.state.metrics = metrics
        self.permits = Permits(
            settings.max_concurrent_requests,
            metrics.inputs_in_flight.set,
            shared_permits,
            BULK_SHARE if settings.priority else 1.0,
        )
        metrics.inputs_limit.set(settings.max_concurrent_requests)
        self.unsent = UnsentAnswers(settings.max_unsent_bytes, metrics.unsent_answer_bytes.set)
        self.traces = provider(settings) if settings.otlp_endpoint else None
        self.tracer = self.traces.get_tracer("prensa.gateway") if self.traces else None
        self.vertex = vertex
        routers = (*ROUTERS, vertex)
        for router in routers:
            self.include_router(router)
        self.error_shapes = ErrorShapes(
            (route for router in routers for route in router.routes), dialects.error_shape
        )

    @property
    def open_paths(self) -> frozenset[str]:
        return OPEN_PATHS | {
            cast(GatewayRoute, r).path
            for r in self.vertex.routes
            if "GET" in getattr(r, "methods", ())
        }

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack (not a public API: tests/fast/test_private_reaches.py pins it) inside
        the gateway's own ASGI layers, the direct routes first."""
        settings, metrics = self.gateway_settings, self.state.metrics

        def on_reject(kind: ErrorKind) -> None:
            metrics.request_failure.inc(kind.value)

        direct = (
            {r.path: r for r in INFERENCE_ROUTES if isinstance(r, GatewayRoute) and r.direct}
            if self.direct_routes
            else {}
        )
        handlers = {
            kind: handler
            for kind, handler in self.exception_handlers.items()
            if isinstance(kind, type)
        }
        app: ASGIApp = DirectRoutes(super().build_middleware_stack(), direct, cast(Any, handlers))
        app = PacedAnswer(
            app,
            self.permits,
            self.unsent,
            # the write timeout drops a client that reads nothing, and its answer with it
            max(int(settings.write_timeout_s), 1),
            on_reject,
            self.error_shapes,
        )
        app = CancelOnHangUp(app)
        uploads = {batches.FILES_PATH: settings.upload_limit}
        app = JsonBody(app, settings.payload_limit, on_reject, self.error_shapes, uploads)
        if settings.api_key:
            app = ApiKey(app, settings.api_key, self.open_paths)
        if self.tracer is not None:
            app = Traced(app, self.tracer, untraced=self.open_paths)
        app = RequestLog(app, enabled=settings.access_log)
        if settings.cors_allow_origins:
            app = CORSMiddleware(
                app,
                allow_origins=list(settings.cors_allow_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["*"],
                expose_headers=["*"],
            )
        return app


def triton_backend(settings: GatewaySettings) -> Backend:
    """The default backend: the Tritons of --triton-url, least outstanding requests, health-checked."""
    return ReplicaPool(
        [
            TritonClient(url, settings.triton_timeout_s, settings.probe_timeout_s)
            for url in settings.triton_urls
        ]
    )


def create_app(
    settings: GatewaySettings,
    environ: Mapping[str, str] = os.environ,
    other_metrics: Sequence[CollectorRegistry] = (),
    backend: BackendFactory | None = None,
    direct_routes: bool = True,
    shared_permits: SharedPermits | None = None,
    host: str = LOOPBACK,
) -> FastAPI:
    """The gateway; it opens its backend and reads the served models when it starts. `other_metrics`
    are rendered on its /metrics after its own (`prensa serve`'s supervisor). `backend` builds what
    answers (see `prensa.gateway.backends.base`), called in the app's event loop: by default
    `triton_backend`; `backends.local.InProcessBackend.from_settings` runs `settings.repo` in this
    process (tests, machines without Triton). `direct_routes` False sends every request through
    FastAPI: what the tests compare the direct routes with. `shared_permits`: this worker's slot of
    the permits all of a gateway's workers share (`prensa.gateway.workers`). `host`: the HTTP
    server's, where TEI's gRPC API listens too with `settings.tei_grpc_port` (`prensa.gateway.grpc.server`)."""
    metrics = GatewayMetrics()
    metrics.others.extend(other_metrics)
    open_backend = backend or triton_backend

    @asynccontextmanager
    async def lifespan(app: GatewayApp) -> AsyncIterator[None]:
        client = open_backend(settings)
        registry = Registry(client, settings.repo, settings.default_model)
        try:
            await registry.refresh()
        except GatewayError as exc:
            log.warning("%s; the model list is read again on the next request", exc.message)
        if (
            registry.models
            and settings.default_model
            and settings.default_model not in registry.models
        ):
            await client.close()
            raise RuntimeError(
                f"--default-model {settings.default_model} is not served; "
                f"Triton serves {', '.join(registry.models)}"
            )
        prompt = settings.default_prompt_name
        if (
            registry.models
            and prompt
            and not any(prompt in m.prompts for m in registry.models.values())
        ):
            await client.close()
            raise RuntimeError(
                f"--default-prompt-name {prompt}: no served model has a prompt of that name"
            )
        client.start_probing(lambda: sorted(registry.triton_models()))
        app.state.gateway = gateway = Gateway(
            settings=settings,
            client=client,
            registry=registry,
            service=Service(
                settings, client, metrics, app.permits, registry.uses, Shadows(registry, metrics)
            ),
            metrics=metrics,
            tracer=app.tracer,
        )
        tei_grpc = None
        if settings.tei_grpc_port is not None:
            # grpc's server only when asked for
            from prensa.gateway.grpc.server import TeiGrpcServer

            try:  # a worker of a pool (it has a slot of shared permits): every worker binds the port
                tei_grpc = await TeiGrpcServer.start(
                    gateway, host, settings.tei_grpc_port, reuse_port=shared_permits is not None
                )
            except RuntimeError:
                await client.close()
                raise
            # `server.GatewayServer` starts its drain with the HTTP server's
            app.state.tei_grpc = tei_grpc
        bulk = None
        if settings.data_dir is not None:
            app.state.jobs = JobStore(settings.data_dir)
            bulk = asyncio.create_task(
                JobRunner(app.state.jobs, app, settings.api_key, registry.current).run_forever()
            )
        yield
        if bulk is not None:  # a line in flight is answered again by the next gateway
            bulk.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bulk
        if tei_grpc is not None:
            await tei_grpc.stop(settings.graceful_timeout_s)
        await client.close()
        if app.traces is not None:  # the last spans go out (or time out) before the process ends
            await asyncio.to_thread(app.traces.shutdown)

    app = GatewayApp(
        settings,
        metrics,
        vertex_router(environ),
        direct_routes,
        shared_permits,
        title="prensa gateway",
        summary="OpenAI-, TEI-, Cohere-, Jina- and NIM-compatible embeddings and reranking over Triton",
        lifespan=lifespan,
    )
    # Starlette calls each with the exception class it is registered for.
    app.add_exception_handler(GatewayError, cast(HTTPExceptionHandler, on_gateway_error))
    app.add_exception_handler(
        RequestValidationError, cast(HTTPExceptionHandler, on_invalid_request)
    )
    return app
