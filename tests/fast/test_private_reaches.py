"""What the gateway reads of other libraries' code that is not their public API, pinned: each test
fails on an upgrade that changes what the gateway relies on, before a server misbehaves with it.

- `http.connection.GatewayProtocol` subclasses uvicorn's `HttpToolsProtocol`;
- `app.GatewayApp` overrides Starlette's `build_middleware_stack`.
"""

from __future__ import annotations

import asyncio
import inspect

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from prensa.gateway.app import GatewayApp
from prensa.gateway.http.connection import ConnectionLimits, GatewayProtocol, protocol_class

# uvicorn's callbacks GatewayProtocol overrides, with the parameters it takes them with
OVERRIDDEN = {
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "pause_writing": [],
    "resume_writing": [],
}


def parameters(function: object) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]  # type: ignore[arg-type]


def test_uvicorns_callbacks_are_the_ones_overridden():
    for name, taken in OVERRIDDEN.items():
        assert parameters(getattr(HttpToolsProtocol, name)) == taken, name
        assert getattr(GatewayProtocol, name) is not getattr(HttpToolsProtocol, name), name
    assert STATUS_LINE[431].startswith(b"HTTP/1.1 431") and STATUS_LINE[503].startswith(b"HTTP/1.1 503")


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_a_refused_request_is_answered_through_uvicorns_state():
    """The attributes GatewayProtocol reads of uvicorn's (its transport, request cycle and server
    state's default headers), through one request whose headers pass the cap: 431, closed."""

    async def app(scope, receive, send):  # never reached: the request is refused first
        raise AssertionError("the app ran")

    async def run() -> Transport:
        config = uvicorn.Config(app, log_level="error", server_header=False, date_header=False)
        config.load()
        limits = ConnectionLimits(read_timeout_s=5, write_timeout_s=5, max_header_size=64, max_connections=8)
        protocol = protocol_class(limits)(config, ServerState(), app_state={})
        transport = Transport()
        protocol.connection_made(transport)
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100 + b"\r\n\r\n")
        await asyncio.sleep(0)
        return transport

    transport = asyncio.run(run())
    assert transport.written.startswith(b"HTTP/1.1 431") and transport.closed


def test_starlettes_middleware_stack_is_built_where_the_gateway_builds_its_own():
    assert parameters(Starlette.build_middleware_stack) == []
    assert GatewayApp.build_middleware_stack is not Starlette.build_middleware_stack
    assert callable(Starlette(routes=[]).build_middleware_stack())
