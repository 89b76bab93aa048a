"""Admission: permits per input (try-acquire, never queue) and per MiB of an answer being sent,
the rows each ensemble may have in Triton at once (`TritonWindow`), the API key, the JSON content
type and the body size limit; and the end of a request whose client hung up.

The last three are checked in a plain ASGI middleware, before routing and JSON parsing, in
that order (as TEI): an unauthenticated caller learns nothing else, an oversized body is never
parsed.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prensa.gateway.errors import ErrorKind, GatewayError, error_body, overloaded
from prensa.gateway.logs import ERROR_KEY, ID_KEY

T = TypeVar("T")

# Rows an ensemble may have in Triton per replica, in batches of its `max_batch_size`: one per
# encoder instance computing, and this many more tokenized and waiting, so no instance waits for
# the gateway.
ENSEMBLE_SPARE_BATCHES = 1

# An answer holds one permit per this many bytes while it is being sent, in pieces of this size:
# the app builds a body whole, and it waits until the client reads it (or `--write-timeout` drops
# the client), so large unread answers count against --max-concurrent-requests.
ANSWER_BYTES_PER_PERMIT = 1 << 20

# Routes a caller may GET without the API key (TEI leaves the same ones open); `POST /` is inference.
OPEN_PATHS = frozenset({"/health", "/", "/ping", "/metrics", "/docs", "/docs/oauth2-redirect", "/openapi.json"})
OPEN_METHODS = frozenset({"GET", "HEAD"})


class Permits:
    """A try-acquire counting semaphore: asyncio runs one handler at a time, so no lock is needed."""

    def __init__(self, capacity: int, on_change: Callable[[int], None]) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._on_change = on_change

    @contextmanager
    def hold(self, count: int) -> Iterator[None]:
        """Take `count` permits for the duration of the block, or raise Overloaded at once."""
        if self.in_use + count > self.capacity:
            raise overloaded()
        with self.charge(count):
            yield

    @contextmanager
    def charge(self, count: int) -> Iterator[None]:
        """Take `count` permits for the duration of the block even past the capacity: for work
        already admitted (an answer being sent): later requests get 429 while it lasts."""
        self.in_use += count
        self._on_change(self.in_use)
        try:
            yield
        finally:
            self.in_use -= count
            self._on_change(self.in_use)


class TritonWindow:
    """The rows one ensemble has in Triton, at most `capacity`; calls beyond it wait here, first come
    first served, and a call whose client hangs up while it waits leaves without reaching Triton.

    Triton 2.51 cancels an ensemble step only when it creates it: a client that hangs up cancels
    its ensemble request, but the encode step already queued is computed all the same (the
    Python stage sees it as not cancelled). So the gateway keeps that queue short: rows stay
    counted until Triton answers, even for a client that is gone (its call runs on, its answer is
    dropped), and what a storm of hang-ups leaves Triton to compute is at most `capacity` rows.
    A call of more rows than `capacity` waits for an empty window and runs alone."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self.in_triton = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._calls: set[asyncio.Future[Any]] = set()  # the event loop keeps only weak references to tasks

    async def run(self, rows: int, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` once `rows` fit; it finishes even if the caller is cancelled meanwhile."""
        rows = min(rows, self.capacity)
        if self._waiting or self.in_triton + rows > self.capacity:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append((rows, turn))
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # admitted just before the cancellation
                    self._release(rows)
                else:
                    with suppress(ValueError):
                        self._waiting.remove((rows, turn))
                    self._admit()  # it may have held back smaller calls behind it
                raise
        else:
            self.in_triton += rows
        task = asyncio.ensure_future(call())
        self._calls.add(task)
        task.add_done_callback(lambda done: self._finished(done, rows))
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Future[T], rows: int) -> None:
        self._calls.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: nobody awaits the call of a client that is gone
        self._release(rows)

    def _release(self, rows: int) -> None:
        self.in_triton -= rows
        self._admit()

    def _admit(self) -> None:
        while self._waiting:
            rows, turn = self._waiting[0]
            if not turn.cancelled() and self.in_triton + rows > self.capacity:
                return
            self._waiting.popleft()
            if not turn.cancelled():  # a cancelled caller is leaving: it takes nothing
                self.in_triton += rows
                turn.set_result(None)


def is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def key_matches(authorization: str, api_key: str) -> bool:
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


class Guard:
    """ASGI middleware: stamps the arrival time, checks the API key, enforces the body limit."""

    def __init__(self, app: ASGIApp, payload_limit: int, api_key: str | None,
                 on_reject: Callable[[ErrorKind], None], permits: Permits,
                 open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.payload_limit = payload_limit
        self.permits = permits
        self.api_key = api_key
        self.on_reject = on_reject
        self.open_paths = open_paths

    def is_open(self, scope: Scope) -> bool:
        return scope["method"] in OPEN_METHODS and scope["path"] in self.open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["received"] = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and not self.is_open(scope) and not key_matches(headers.get("authorization", ""), self.api_key):
            scope["state"][ERROR_KEY] = "no or wrong API key"
            await self._respond(send, 401, b"", [])
            return
        if scope["method"] == "POST" and not is_json(headers.get("content-type", "")):
            await self._reject(scope, send, GatewayError(ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                                                         "Expected request with `Content-Type: application/json`"))
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.payload_limit:
            await self._too_large(scope, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.payload_limit:
                await self._too_large(scope, send)
                return
            if not message.get("more_body", False):
                break
        await self._serve_while_connected(scope, b"".join(chunks), receive, send)

    async def _serve_while_connected(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        """Run the app on the buffered body, in this task; a client that hangs up before its answer
        cancels it, so its permits and Triton calls are released now rather than when Triton
        answers nobody."""
        serving = asyncio.current_task()
        assert serving is not None  # a coroutine awaited by the server's request task
        gone = asyncio.Event()
        delivered = answered = cancelled = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:  # the server reports a disconnect (or the answer's end) here
            nonlocal cancelled
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not answered:
                cancelled = True
                serving.cancel()

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True  # before the send: its completion may wake the watcher first
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if len(body) <= ANSWER_BYTES_PER_PERMIT:
                await send(message)
                return
            # The server writes a body whole and waits for the client only before the next send:
            # sent a MiB at a time, the answer waits here, counted, not in the connection's buffer.
            more, view = message.get("more_body", False), memoryview(body)
            with self.permits.charge(len(body) // ANSWER_BYTES_PER_PERMIT):
                for start in range(0, len(body), ANSWER_BYTES_PER_PERMIT):
                    end = start + ANSWER_BYTES_PER_PERMIT
                    await send({"type": "http.response.body", "body": bytes(view[start:end]),
                                "more_body": more or end < len(body)})

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, replay, sending)
        except asyncio.CancelledError:
            if not cancelled or serving.uncancel():
                raise  # the server cancelled this request (too)
        else:
            if cancelled:
                serving.uncancel()  # the app finished all the same
        finally:
            watcher.cancel()

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await self._reject(scope, send, GatewayError(ErrorKind.PAYLOAD_TOO_LARGE,
                                                     f"Payload too large: the limit is {self.payload_limit} bytes"))

    async def _reject(self, scope: Scope, send: Send, error: GatewayError) -> None:
        self.on_reject(error.kind)
        scope["state"][ERROR_KEY] = error.message
        await self._respond(send, error.status, error_body(error, scope["path"], scope["state"].get(ID_KEY, "")),
                            [(b"content-type", b"application/json")])

    @staticmethod
    async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
