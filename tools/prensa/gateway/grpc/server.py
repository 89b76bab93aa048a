"""The TEI gRPC server of one gateway process (`--tei-grpc-port`): grpc.aio in the event loop of the
HTTP app, so both answer from the same `Gateway` (service, permits, merged Triton calls) and no
thread or process stands between them. The app's lifespan starts it once the served models are
read, and `server.GatewayServer` starts its drain when the HTTP server starts its own, so one
--graceful-timeout covers both; the lifespan then waits for it before closing the Triton channels.

With several workers (`--workers N`, `prensa.gateway.workers`) every worker serves gRPC on the same
port with SO_REUSEPORT: the kernel spreads gRPC connections over the workers as it spreads HTTP ones
over their shared socket, so gRPC traffic gets the pool's cores too, a dead worker's share is taken
by the others until it is replaced, and the permits stay one pool. (One worker serving gRPC alone
would cap gRPC at one core and lose it with that worker; grpc.aio cannot adopt a socket bound by
the parent, which is how the HTTP port is shared.) gRPC pins a client's calls to its one connection,
so a single client reaches one worker. A lone process binds without SO_REUSEPORT (gRPC sets it by
default), so a port another server holds fails the start instead of being shared.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection

from prensa.gateway.apis.tei.grpc import SERVICE_NAMES, add_servicers
from prensa.gateway.core.limits import grpc_connection_cap
from prensa.gateway.grpc.health import SERVICE_NAME as HEALTH_SERVICE
from prensa.gateway.grpc.health import add_health
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.state import Gateway

log = logging.getLogger("prensa.gateway")


# A connection is pinged after this long without traffic, and closed if no answer comes in the
# timeout: a peer that vanished (a dead client, a dropped NAT mapping) gives its slot back.
KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 60.0, 20.0
# Clients may ping a connection without calls at most this often (grpc's default refuses any
# ping more often than every 5 minutes, and closes the connection with ENHANCE_YOUR_CALM).
MIN_CLIENT_PING_S = 10.0


def connection_bounds(settings: GatewaySettings) -> dict[str, int]:
    """grpc core's options for the connections the port holds: how many, how long a handshake, an
    idle connection and any connection may last, and the keepalive that finds dead peers. A
    connection that never sends its HTTP/2 preface is closed at the handshake deadline, an idle one
    gets GOAWAY (a client reconnects on its next call), and the cap is the port's own descriptor
    budget (`limits.grpc_connection_cap`), apart from HTTP's."""

    def ms(seconds: float) -> int:
        return max(int(seconds * 1000), 1)

    return {
        "grpc.max_allowed_incoming_connections": grpc_connection_cap(settings.max_grpc_connections),
        "grpc.server_handshake_timeout_ms": ms(settings.grpc_handshake_timeout_s),
        "grpc.max_connection_idle_ms": ms(settings.grpc_idle_timeout_s),
        "grpc.max_connection_age_ms": ms(settings.grpc_max_connection_age_s),
        "grpc.max_connection_age_grace_ms": ms(settings.grpc_connection_age_grace_s),
        "grpc.keepalive_time_ms": ms(KEEPALIVE_S),
        "grpc.keepalive_timeout_ms": ms(KEEPALIVE_TIMEOUT_S),
        "grpc.http2.min_ping_interval_without_data_ms": ms(MIN_CLIENT_PING_S),
        "grpc.keepalive_permit_without_calls": 1,
    }


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class TeiGrpcServer:
    """TEI's gRPC services and server reflection on host:port, answering from `gateway`."""

    def __init__(self, server: Any, where: str) -> None:
        self.server = server
        self.address = where
        self._stopping: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, gateway: Gateway, host: str, port: int, reuse_port: bool) -> TeiGrpcServer:
        """Listening once this returns; a port it cannot bind is a RuntimeError naming it (the gateway
        then does not start, as with its HTTP port)."""
        bounds = connection_bounds(gateway.settings)
        options = [
            ("grpc.so_reuseport", int(reuse_port)),
            # a message is a request body: the same limit as HTTP's (gRPC answers RESOURCE_EXHAUSTED above it)
            ("grpc.max_receive_message_length", gateway.settings.payload_limit),
            *bounds.items(),
        ]
        server = grpc.aio.server(options=options)
        add_servicers(server, gateway)
        add_health(server, gateway, SERVICE_NAMES)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, HEALTH_SERVICE, reflection.SERVICE_NAME), server
        )
        where = address(host, port)
        try:
            server.add_insecure_port(where)
        except RuntimeError as exc:
            raise RuntimeError(
                f"--tei-grpc-port {port}: cannot listen on {where} (is the port taken?)"
            ) from exc
        await server.start()
        log.info("TEI gRPC API (%s) on %s", ", ".join(SERVICE_NAMES), where)
        log.info(
            "TEI gRPC connections: at most %d, %g s to handshake, closed after %g s idle, asked to go "
            "away after %g s (%g s grace), pinged after %g s without traffic",
            bounds["grpc.max_allowed_incoming_connections"],
            bounds["grpc.server_handshake_timeout_ms"] / 1000,
            bounds["grpc.max_connection_idle_ms"] / 1000,
            bounds["grpc.max_connection_age_ms"] / 1000,
            bounds["grpc.max_connection_age_grace_ms"] / 1000,
            bounds["grpc.keepalive_time_ms"] / 1000,
        )
        return cls(server, where)

    def begin_stop(self, grace_s: float) -> None:
        """Refuse new calls now; calls in flight get `grace_s` seconds, then are cancelled."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self.server.stop(grace_s))

    async def stop(self, grace_s: float) -> None:
        """`begin_stop` (unless begun) and wait until the server has stopped."""
        self.begin_stop(grace_s)
        assert self._stopping is not None  # `begin_stop` made it
        await self._stopping
