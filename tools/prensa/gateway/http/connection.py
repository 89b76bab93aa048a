"""One HTTP connection's protocol: uvicorn's httptools protocol with the limits a server facing
untrusted clients needs and uvicorn lacks.

- A request (line, headers and body) must arrive within `read_timeout_s` of the connection
  opening, or of its own first byte on a kept-alive connection: a client that opens connections
  and never finishes a request would otherwise hold a file descriptor each, for ever. Idle time
  between requests stays uvicorn's keep-alive timeout.
- The URL and headers are at most `max_header_size` bytes (431): httptools, unlike h11, has no
  limit of its own. uvicorn picks httptools whenever it is installed, and it is a dependency.
- An answer the client reads nothing of for `write_timeout_s` is dropped with its connection:
  what the app sent waits in the transport's buffer until the client reads it (`middleware.PacedAnswer` sends
  answers above 1 MiB a MiB at a time, holding permits meanwhile: `middleware.ANSWER_BYTES_PER_PERMIT`).
- Past `max_connections` open connections a new one gets 503 and is closed at once. uvicorn's
  `limit_concurrency` answers 503 only once a request's headers arrive, so connections that never
  send them would still take every descriptor and lock the listening socket out of accept().

`GatewayProtocol` subclasses uvicorn's `HttpToolsProtocol`, which is not a public API (pyproject
pins uvicorn below the next minor for it): it overrides the connection and parser callbacks and
reads `transport`, `cycle`, `server_state` and `STATUS_LINE`. No public hook gives a deadline per
request or a cap on header bytes at the same cost. `tests/fast/test_private_reaches.py` fails on a
uvicorn that changes any of them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from prensa.gateway.core.limits import connection_cap, grpc_connection_cap
from prensa.gateway.settings import GatewaySettings

log = logging.getLogger("prensa.gateway")


@dataclass(frozen=True)
class ConnectionLimits:
    read_timeout_s: float
    write_timeout_s: float
    max_header_size: int
    max_connections: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> ConnectionLimits:
        return cls(
            settings.request_read_timeout_s,
            settings.write_timeout_s,
            settings.max_header_size,
            connection_cap(
                settings.max_connections,
                grpc_connection_cap(settings.max_grpc_connections)
                if settings.tei_grpc_port is not None
                else None,
            ),
        )


class GatewayProtocol(HttpToolsProtocol):
    """HttpToolsProtocol plus the read deadline, header limit, write watchdog and connection cap;
    `protocol_class` binds the limits. The parser callbacks stop touching the request once it is
    refused, since httptools goes on parsing the rest of the bytes it was fed."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_deadline: asyncio.TimerHandle | None = None
        self.write_watch: asyncio.TimerHandle | None = None
        self.unsent = 0  # bytes waiting in the transport when the write watchdog last looked
        self.awaiting_headers = True
        self.pending = 0  # bytes fed to the parser while this request's headers are incomplete
        self.progressed = False  # the parser completed headers or a request in the bytes last fed
        self.header_size = 0  # the URL and header names and values parsed so far
        self.refused = False

    # Connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.refuse(503, "Too many open connections.")
            return
        self.arm_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.read_deadline, self.write_watch):
            if timer is not None:
                timer.cancel()
        self.read_deadline = self.write_watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self.progressed = False
        super().data_received(data)
        # The callbacks never see headers that do not end; bytes that completed something
        # belong partly to a body, so only bytes that completed nothing count.
        if self.awaiting_headers and not self.progressed and not self.refused:
            self.pending += len(data)
            if self.pending > self.limits.max_header_size:
                self.refuse(431, "Request header fields too large.")

    def refuse(self, status: int, reason: str) -> None:
        """Answer `status` and close, unless a response of the app's is under way (pipelining):
        then just close, as a second status line would read as that response's."""
        self.refused = True
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None
        if self.cycle is None or self.cycle.response_complete:
            body = reason.encode("ascii")
            head = [
                STATUS_LINE[status],
                *(
                    name + b": " + value + b"\r\n"
                    for name, value in self.server_state.default_headers
                ),
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
        self.transport.close()

    # Read deadline and header size

    def arm_read_deadline(self) -> None:
        self.read_deadline = self.loop.call_later(self.limits.read_timeout_s, self.read_timed_out)

    def read_timed_out(self) -> None:
        self.read_deadline = None
        if self.transport.is_closing():
            return
        log.debug(
            "closing a connection whose request did not arrive in %g s", self.limits.read_timeout_s
        )
        if self.awaiting_headers:
            self.refuse(408, "Request timeout.")
        else:  # the app has the request and sees the disconnect
            self.refused = True
            self.transport.close()

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        if self.read_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self.arm_read_deadline()  # a later request on a kept-alive connection, not one pipelined
            # behind a request still being served (uvicorn stops reading until that one is answered)

    def on_url(self, url: bytes) -> None:
        self.header_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_size += len(name) + len(value)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        self.awaiting_headers, self.progressed = False, True
        if self.header_size > self.limits.max_header_size:
            self.refuse(431, "Request header fields too large.")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None
        self.awaiting_headers, self.progressed, self.pending, self.header_size = True, True, 0, 0
        super().on_message_complete()

    # Write watchdog: the transport calls pause_writing above its high-water mark.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_watch is None:
            self.unsent = self.transport.get_write_buffer_size()
            self.write_watch = self.loop.call_later(self.limits.write_timeout_s, self.check_writes)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_watch is not None:
            self.write_watch.cancel()
            self.write_watch = None

    def check_writes(self) -> None:
        """Drop a connection whose client read nothing since the last look; abort() frees the buffer
        that close() would keep until it is sent."""
        unsent = self.transport.get_write_buffer_size()
        if unsent >= self.unsent:
            self.write_watch = None
            log.debug(
                "dropping a client that read nothing of its answer in %g s (%d bytes unsent)",
                self.limits.write_timeout_s,
                unsent,
            )
            self.transport.abort()
            return
        self.unsent = unsent
        self.write_watch = self.loop.call_later(self.limits.write_timeout_s, self.check_writes)


def protocol_class(limits: ConnectionLimits) -> type[GatewayProtocol]:
    """A GatewayProtocol bound to `limits`, for `uvicorn.Config(http=...)` (uvicorn builds the
    protocol of each connection itself, from the config alone)."""
    return type("GatewayProtocol", (GatewayProtocol,), {"limits": limits})
