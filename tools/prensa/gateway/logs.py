"""Request ids and the gateway's logs: one line per request, as text or JSON lines.

`RequestLog` is the outermost ASGI layer but CORS: it takes the client's `x-request-id` (or the
trace id of its W3C `traceparent`), makes one up when there is none, echoes it on every response,
401s and 413s included, and hands it to the routes (the request's `RequestContext`, then Triton as the
inference request id). When the response is sent it logs one line with the route, status, model,
inputs, tokens and each stage's milliseconds, the reason of a 4xx or 5xx, which the error
handlers leave in the request's state under `ERROR_KEY`, and the trace id of a traced request
(`tracing`), to find its trace from its log line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access = logging.getLogger("prensa.access")
REQUEST_ID_HEADER = b"x-request-id"
# A client's id is kept when it is short and plain (it goes into logs and headers as it is).
CLIENT_REQUEST_ID = re.compile(r"[\w.:/+=@-]{1,128}")
TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?P<trace>[0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
# In the ASGI scope's "state": the request id, when it arrived (perf_counter), an error's reason,
# the RequestContext, a sampled trace's id.
ID_KEY, RECEIVED_KEY, ERROR_KEY, CONTEXT_KEY, TRACE_KEY = (
    "request_id",
    "received",
    "error",
    "context",
    "trace_id",
)


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's `x-request-id`, else its `traceparent`'s trace id, else a new random id."""
    given = {
        name.decode(): value.decode("latin-1")
        for name, value in headers
        if name in (REQUEST_ID_HEADER, b"traceparent")
    }
    if CLIENT_REQUEST_ID.fullmatch(client := given.get("x-request-id", "")):
        return client
    if (trace := TRACEPARENT.fullmatch(given.get("traceparent", "").strip().lower())) and trace[
        "trace"
    ] != "0" * 32:
        return trace["trace"]
    return os.urandom(16).hex()  # 32 hex digits, as a trace id; a third of uuid4().hex's cost


def _ms(seconds: float | None) -> float:
    return round((seconds or 0.0) * 1000, 2)


class RequestLog:
    """ASGI middleware: the request id on the way in and out, one log line per request."""

    def __init__(self, app: ASGIApp, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        state[ID_KEY] = rid = request_id(scope["headers"])
        state[RECEIVED_KEY] = started
        status = 500  # what the client sees when the app raises before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    (REQUEST_ID_HEADER, rid.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if self.enabled and access.isEnabledFor(
                logging.WARNING if status >= 500 else logging.INFO
            ):
                self.log(scope, status, time.perf_counter() - started)

    @staticmethod
    def log(scope: Scope, status: int, seconds: float) -> None:
        state = scope["state"]
        fields: dict[str, Any] = {
            "request_id": state[ID_KEY],
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "total_ms": _ms(seconds),
        }
        if (context := state.get(CONTEXT_KEY)) is not None:
            fields |= {
                "model": context.model,
                "inputs": context.inputs,
                "tokens": context.tokens,
                "tokenization_ms": _ms(context.tokenization_s),
                "queue_ms": _ms(context.queue_s),
                "inference_ms": _ms(context.inference_s),
            }
        if error := state.get(ERROR_KEY):
            fields["error"] = error
        if trace := state.get(TRACE_KEY):
            fields["trace_id"] = trace
        level = logging.WARNING if status >= 500 else logging.INFO
        # `Logger.log` would also look up the caller's file and line, which no formatter here prints.
        access.handle(
            access.makeRecord(
                access.name,
                level,
                "",
                0,
                "%s %s %d %.1f ms",
                (scope["method"], scope["path"], status, fields["total_ms"]),
                None,
                extra={"fields": fields},
            )
        )


class SecondClock(logging.Formatter):
    """`formatTime` as logging writes it, its date and time part computed once per second rather
    than once per line: the access log writes a line per request."""

    _stamp: tuple[tuple[int, str | None], str] = ((-1, None), "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        key, stamp = self._stamp
        if key != (second := (int(record.created), datefmt)):
            stamp = time.strftime(
                datefmt or self.default_time_format, self.converter(record.created)
            )
            self._stamp = second, stamp  # one assignment: a thread reads both halves or neither
        # logging's default_msec_format
        return stamp if datefmt else f"{stamp},{int(record.msecs):03d}"


class JsonLines(SecondClock):
    """One JSON object per record (TEI's `--json-output`): time, level, logger, message and the
    record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "target": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class Text(SecondClock):
    """Plain lines; a record's `fields` follow its message as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        return (
            line + "".join(f" {key}={value}" for key, value in fields.items()) if fields else line
        )


class Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever `sys.stderr` is when it writes, not the one it was made with."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def configure_logging(level: str, json_output: bool) -> None:
    """prensa's loggers to stderr at `level`, as JSON lines or text."""
    handler = Stderr()
    handler.setFormatter(
        JsonLines() if json_output else Text("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger("prensa")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
