"""The gateway's HTTP server in one process (`worker_server`; `workers.gateway_server` picks one
or a pool of them), its connections held to the limits of `http.connection`.

`GatewayServer` is uvicorn's server with the heap the gateway keeps for its whole life (modules,
the app, its routes and schemas, the served models) moved out of the cyclic garbage
collector once it has started (`gc.freeze`): a full collection then walks only what requests
create, instead of the whole startup heap every time (docs/performance.md, "The garbage
collector").
"""

from __future__ import annotations

import gc
import logging
import resource
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import uvicorn
from prometheus_client import CollectorRegistry

from prensa.gateway.core.limits import SharedPermits, connection_ceiling
from prensa.gateway.http.connection import ConnectionLimits, protocol_class
from prensa.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from prensa.gateway.backends.base import BackendFactory

log = logging.getLogger("prensa.gateway")


@dataclass(frozen=True)
class DescriptorLimit:
    """The soft RLIMIT_NOFILE before and after `raise_descriptor_limit`, and the hard one."""

    before: int
    soft: int
    hard: int

    def describe(self) -> str:
        def shown(value: int) -> str:
            return "unlimited" if value == resource.RLIM_INFINITY else str(value)

        change = (
            f"{shown(self.before)} -> {shown(self.soft)}"
            if self.before != self.soft
            else shown(self.soft)
        )
        return (
            f"file descriptors: soft limit {change} (hard {shown(self.hard)}); the gateway takes up to "
            f"{connection_ceiling()} connections"
        )


def raise_descriptor_limit() -> DescriptorLimit:
    """Raise the soft descriptor limit to the hard one, as servers do at start: the soft default
    (often 1024) would let a thousand idle connections lock new clients out. Triton, started after,
    inherits it."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if before != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. a hard limit the kernel caps lower (nr_open)
            log.warning(
                "could not raise the file-descriptor limit from %s to %s: %s", before, hard, exc
            )
    return DescriptorLimit(before, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)


class GatewayServer(uvicorn.Server):
    """uvicorn's server, its startup heap frozen out of the garbage collector while it serves; TEI's
    gRPC server (`--tei-grpc-port`), when the app runs one, drains alongside it on shutdown."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # the app's lifespan has run: the served models are read
            gc.collect()  # what startup left as garbage is freed, not frozen
            gc.freeze()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        tei_grpc = getattr(getattr(self.config.app, "state", None), "tei_grpc", None)
        # TEI's gRPC calls drain alongside the HTTP requests, in the same --graceful-timeout
        if tei_grpc is not None:
            tei_grpc.begin_stop(self.config.timeout_graceful_shutdown)
        await super().shutdown(sockets=sockets)
        gc.unfreeze()  # the app can be collected again (several gateways come and go in a test process)


class Serving(Protocol):
    """What runs the gateway until told to stop: one `GatewayServer`, or a `workers.WorkerPool` of them."""

    should_exit: bool
    started: bool

    def run(self) -> None: ...


def worker_server(
    settings: GatewaySettings,
    host: str,
    port: int,
    other_metrics: Sequence[CollectorRegistry] = (),
    backend: BackendFactory | None = None,
    shared_permits: SharedPermits | None = None,
) -> GatewayServer:
    """One process's uvicorn server for the gateway (`gateway_server`'s, or one worker's)."""
    from prensa.gateway.app import create_app

    app = create_app(
        settings,
        other_metrics=other_metrics,
        backend=backend,
        shared_permits=shared_permits,
        host=host,
    )
    return GatewayServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            # uvicorn hands both to asyncio as they are: fractions of a second hold
            access_log=False,
            timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
            http=protocol_class(ConnectionLimits.of(settings)),
            timeout_graceful_shutdown=settings.graceful_timeout_s,  # type: ignore[arg-type]
        )
    )


def run_server(server: Serving, sockets: list[socket.socket] | None = None) -> bool:
    """Serve until stopped; False when it never started (uvicorn exits on a failed start-up).
    `sockets`: listening sockets to accept on instead of binding host:port (a worker's)."""
    try:
        if sockets is None:
            server.run()
        else:
            cast(GatewayServer, server).run(sockets=sockets)
    except SystemExit:
        return False
    return server.started
