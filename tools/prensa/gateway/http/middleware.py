"""The gateway's HTTP admission layers, each a small ASGI middleware with one job.

They run before routing and JSON parsing, in this order (as TEI): `ApiKey` (401: an
unauthenticated caller learns nothing else), `JsonBody` (415 for a body that is not JSON, 413 for
one over the limit, which is never parsed), `CancelOnHangUp` (a client that leaves before its
answer cancels its request, so its permits and Triton calls are freed now), `PacedAnswer` (a
large answer goes out a MiB at a time, counted against --max-concurrent-requests while the client
reads it). `GatewayApp` stacks them in front of FastAPI, which routes every request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prensa.gateway.auth import key_matches
from prensa.gateway.core.limits import MemoryTrim, Permits, UnsentAnswers
from prensa.gateway.errors import ErrorKind, ErrorShape, GatewayError, error_body, error_status
from prensa.gateway.logs import ERROR_KEY, ID_KEY

# An answer holds one permit per this many bytes while it is being sent, in pieces of this size:
# the app builds a body whole, and it waits until the client reads it (or `--write-timeout` drops
# the client), so large unread answers count against --max-concurrent-requests.
ANSWER_BYTES_PER_PERMIT = 1 << 20

# Routes a caller may GET without the API key (TEI leaves the same ones open); `POST /` is inference.
OPEN_PATHS = frozenset(
    {
        "/health",
        "/",
        "/ping",
        "/v1/health/ready",
        "/v1/health/live",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/openapi.json",
    }
)
OPEN_METHODS = frozenset({"GET", "HEAD"})


def is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def is_multipart(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "multipart/form-data"


def header(scope: Scope, name: bytes) -> str:
    """The first value of header `name` (lower case), or ""."""
    return next(
        (value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), ""
    )


def only_header(scope: Scope, name: bytes) -> str:
    """The value of header `name` (lower case) when it comes once, else "": a second value is
    ambiguous, and taking either would let the other slip by unchecked."""
    values = [value for key, value in scope["headers"] if key.lower() == name]
    return values[0].decode("latin-1") if len(values) == 1 else ""


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: bytes | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if content_type:
        headers.append((b"content-type", content_type))
    headers += [(name.lower().encode(), value.encode()) for name, value in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def reject(
    scope: Scope,
    send: Send,
    error: GatewayError,
    on_reject: Callable[[ErrorKind], None],
    shape: ErrorShape,
) -> None:
    """Answer `error` in the route's error `shape` and count it, before any route has run."""
    on_reject(error.kind)
    state = scope.setdefault("state", {})
    state[ERROR_KEY] = error.message
    await respond(
        send,
        error_status(error, shape),
        error_body(error, shape, state.get(ID_KEY, "")),
        b"application/json",
        error.headers,
    )


class ApiKey:
    """401 without `Authorization: Bearer <api_key>`, but for the GET routes of `open_paths`."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.api_key = api_key
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or (scope["method"] in OPEN_METHODS and scope["path"] in self.open_paths)
            or key_matches(only_header(scope, b"authorization"), self.api_key)
        ):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})[ERROR_KEY] = "no or wrong API key"
        await respond(send, 401)


class JsonBody:
    """POST bodies must be JSON (415) of at most `limit` bytes (413, by the declared length or as
    they arrive); the app then gets the whole body in one message. `uploads` are the paths that take
    a multipart file instead, of at most their own limit, streamed to the app as it arrives."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        on_reject: Callable[[ErrorKind], None],
        shape_of: Callable[[str], ErrorShape] = lambda path: ErrorShape.TEI,
        uploads: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.shape_of = shape_of  # the error shape of the route at a path
        self.uploads = uploads or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        upload_limit = self.uploads.get(scope["path"])
        if upload_limit is not None and is_multipart(header(scope, b"content-type")):
            await self._upload(scope, receive, send, upload_limit)
            return
        if not is_json(header(scope, b"content-type")):
            await reject(
                scope,
                send,
                GatewayError(
                    ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                    "Expected request with `Content-Type: application/json`",
                ),
                self.on_reject,
                self.shape_of(scope["path"]),
            )
            return
        declared = header(scope, b"content-length")
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._too_large(scope, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def whole_body() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, whole_body, send)

    async def _too_large(self, scope: Scope, send: Send, limit: int | None = None) -> None:
        await reject(
            scope,
            send,
            GatewayError(
                ErrorKind.PAYLOAD_TOO_LARGE,
                f"Payload too large: the limit is {limit or self.limit} bytes",
            ),
            self.on_reject,
            self.shape_of(scope["path"]),
        )

    async def _upload(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """A file upload: refused by its declared length, else passed on as it arrives; past the
        limit the app's read fails, and the request with it."""
        declared = header(scope, b"content-length")
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(scope, send, limit)
            return
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                raise GatewayError(
                    ErrorKind.PAYLOAD_TOO_LARGE, f"Payload too large: the limit is {limit} bytes"
                )
            return message

        await self.app(scope, counted, send)


class CancelOnHangUp:
    """Runs the app in the server's request task and cancels it when the client hangs up before the
    answer's last byte, so what the request holds (permits, a place in a `TritonWindow`, a gRPC
    call) is released now rather than when Triton answers nobody. It reads the request's messages
    itself from the start and hands the app those before the disconnect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        serving = asyncio.current_task()
        assert serving is not None  # a coroutine awaited by the server's request task
        loop = serving.get_loop()
        messages: deque[Message] = deque()  # read by the watcher, not yet by the app
        # the app's receive() calls waiting for the next message
        waiting: list[asyncio.Future[None]] = []
        answered = cancelled = False

        def keep(message: Message) -> None:
            messages.append(message)
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)
            waiting.clear()

        async def watch() -> None:
            nonlocal cancelled
            while (message := await receive())["type"] != "http.disconnect":
                keep(message)
            keep(message)
            if not answered:
                cancelled = True
                serving.cancel()

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True  # before the send: its completion may wake the watcher first
            await send(message)

        async def replay() -> Message:
            while not messages:
                waiting.append(waiter := loop.create_future())
                await waiter
            message = (
                messages[0] if messages[0]["type"] == "http.disconnect" else messages.popleft()
            )
            return message  # a disconnect stays: every later receive() reports it too

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


class PacedAnswer:
    """Sends a body over `ANSWER_BYTES_PER_PERMIT` a MiB at a time, each piece only once the client
    has taken the last (the server waits for the transport to drain before its next send), so the
    answer waits here, counted, not in the connection's buffer. Meanwhile it holds one of `permits`
    per MiB and its bytes in `unsent`: an answer that `unsent` cannot hold is replaced by a 503 with
    Retry-After, and while `unsent` is full, requests get that 503 before any work. Once a large
    answer is gone, its memory goes back to the system (`trim`)."""

    def __init__(
        self,
        app: ASGIApp,
        permits: Permits,
        unsent: UnsentAnswers,
        retry_after_s: int,
        on_reject: Callable[[ErrorKind], None],
        shape_of: Callable[[str], ErrorShape] = lambda path: ErrorShape.TEI,
    ) -> None:
        self.app = app
        self.permits = permits
        self.unsent = unsent
        self.retry_after_s = retry_after_s
        self.on_reject = on_reject
        self.shape_of = shape_of
        self.trim = MemoryTrim()

    async def _refuse(self, scope: Scope, send: Send) -> None:
        """503 with Retry-After: the answers held for clients that have not read them are at the cap."""
        backlog = GatewayError(
            ErrorKind.SENDING,
            f"The gateway holds {self.unsent.held} bytes of answers its clients have not read "
            f"(--max-unsent-bytes {self.unsent.capacity}); retry later",
            self.retry_after_s,
        )
        await reject(scope, send, backlog, self.on_reject, self.shape_of(scope["path"]))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.unsent.full and scope["method"] == "POST":
            await self._refuse(scope, send)
            return
        start: Message | None = None
        paced = False

        async def sending(message: Message) -> None:
            nonlocal start, paced
            if message["type"] == "http.response.start":
                start = message  # sent with the first piece of the body, once it is known to fit
                return
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if start is None or len(body) <= ANSWER_BYTES_PER_PERMIT:
                if start is not None:
                    await send(start)
                    start = None
                await send(message)
                return
            paced = True
            with self.unsent.hold(len(body)) as held:
                if not held:
                    start = None
                    await self._refuse(scope, send)
                    return
                await send(start)
                start = None
                await self._pieces(send, body, message.get("more_body", False))

        try:
            await self.app(scope, receive, sending)
        finally:  # a client dropped mid-answer ends it with an exception: that memory goes back too
            if paced:
                self.trim.ask()

    async def _pieces(self, send: Send, body: bytes, more: bool) -> None:
        view = memoryview(body)
        with self.permits.charge(len(body) // ANSWER_BYTES_PER_PERMIT):
            for start in range(0, len(body), ANSWER_BYTES_PER_PERMIT):
                end = start + ANSWER_BYTES_PER_PERMIT
                await send(
                    {
                        "type": "http.response.body",
                        "body": bytes(view[start:end]),
                        "more_body": more or end < len(body),
                    }
                )
