"""What the gateway's two servers (HTTP and TEI's gRPC) share: the gateway's state, built when the
app starts, TEI's timing headers, and the count of an answered request."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from opentelemetry.trace import Tracer

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.registry import Registry
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.service import Service
from prensa.gateway.errors import GatewayError
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.settings import GatewaySettings
from prensa.triton.versions import version_of

CHUNKS_HEADER = "x-prensa-chunks"


@dataclass
class Gateway:
    """What the routes reach through `GatewayRequest.gateway` and the gRPC servicers through their
    `Calls`, built when the app starts."""

    settings: GatewaySettings
    client: Backend
    registry: Registry
    service: Service
    metrics: GatewayMetrics
    # --otlp-endpoint's tracer, for what the ASGI layer does not see (TEI's gRPC calls)
    tracer: Tracer | None = None
    # Unix time: OpenAI's `created` of every model
    started: float = field(default_factory=time.time)
    # one change of the served models at a time (`apis.admin`); the repository's lock orders processes
    model_changes: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def unhealthy(self) -> str | None:
        """Why the gateway cannot answer now (Triton unreachable, a model not ready), or None: what
        `/health` and gRPC's health service both report."""
        try:
            await self.registry.ensure()
            return await self.registry.unready()
        except GatewayError as exc:
            return exc.message


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


VERSION_HEADER = "x-prensa-model-version"


def timing_headers(context: RequestContext) -> dict[str, str]:
    """TEI's timing headers (HTTP headers, and the initial metadata of a TEI gRPC answer)."""
    queue = context.queue_s or 0.0
    headers = {
        "x-compute-type": "triton",
        "x-compute-time": _ms(context.tokenization_s + queue + context.inference_s),
        "x-compute-characters": str(context.characters),
        "x-compute-tokens": str(context.tokens),
        "x-total-time": _ms(time.perf_counter() - context.received),
        "x-tokenization-time": _ms(context.tokenization_s),
        "x-queue-time": _ms(queue),
        "x-inference-time": _ms(context.inference_s),
    }
    if context.chunks is not None:  # windows per input, in order
        headers[CHUNKS_HEADER] = ",".join(map(str, context.chunks))
    if context.model:  # which version computed it (`triton.versions`)
        headers[VERSION_HEADER] = str(version_of(context.model))
    return headers


def record_success(metrics: GatewayMetrics, method: str, context: RequestContext) -> None:
    """Count an answered request under `method`, with its time and the parts of it."""
    metrics.succeeded(
        method,
        time.perf_counter() - context.received,
        context.tokenization_s,
        context.queue_s or 0.0,
        context.inference_s,
        context.model,
    )
