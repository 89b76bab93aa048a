"""gRPC's standard health service (`grpc.health.v1.Health`) beside TEI's, as TEI's gRPC server offers
it: gRPC load balancers and Kubernetes' gRPC probes ask it. It tells what `/health` tells: SERVING
while the gateway can answer (Triton reachable, every model ready), NOT_SERVING otherwise, for the
whole server ("") and for each TEI service; another name is NOT_FOUND (`Watch`: SERVICE_UNKNOWN, as
the protocol asks). Open without the API key, as `/health` and reflection are."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prensa.gateway.state import Gateway

SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
WATCH_INTERVAL_S = 1.0  # how often a `Watch` looks again; it answers only when the status changes


class GatewayHealth:
    """The health servicer (duck-typed: `add_HealthServicer_to_server` looks up `Check` and `Watch`)."""

    def __init__(self, gateway: Gateway, services: tuple[str, ...]) -> None:
        self.gateway = gateway
        self.services = frozenset(("", *services))

    async def status(self, service: str) -> Any:
        if service not in self.services:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        healthy = await self.gateway.unhealthy() is None
        return (
            health_pb2.HealthCheckResponse.SERVING
            if healthy
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's method name
        status = await self.status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        last = None
        while True:
            status = await self.status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_INTERVAL_S)


def add_health(server: Any, gateway: Gateway, services: tuple[str, ...]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(GatewayHealth(gateway, services), server)
