"""What every TEI gRPC call shares, whatever its service: the API key, the model its metadata names,
its request id and context, its trace span, the gateway's metrics and access log, and its errors as
gRPC statuses.

A message of a stream is a request of its own (as TEI handles it): counted, timed and admitted
(permits, try-acquire) like an HTTP request. A stream's messages run concurrently, at most
--max-client-batch-size at once, so they merge into shared Triton calls as concurrent HTTP requests
do (`dispatch`), and their answers go back in the messages' order. The first failure ends the
stream with its status, as a failed message ends a TEI stream, once the client has stopped writing
(or a short while has passed), so that the client reads that status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import grpc
from opentelemetry.trace import Span, StatusCode

from prensa.gateway.auth import key_matches
from prensa.gateway.core.request_context import (
    PRIORITY_HEADER,
    Priority,
    RequestContext,
    priority_refusal,
)
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.logs import REQUEST_ID_HEADER, access, request_id
from prensa.gateway.state import Gateway, record_success, timing_headers
from prensa.gateway.tracing import rpc_span

Q = TypeVar("Q")  # a request message
R = TypeVar("R")  # what handling it gives
# A request's work: the message, the model the call's metadata names (None: the default), its context.
Work = Callable[[Q, str | None, RequestContext], Awaitable[R]]

MODEL_KEY = "model"  # metadata naming the served model, as `?model=` on HTTP (TEI serves one model: no field)
AUTH_KEY = "authorization"
TRACE_KEYS = ("traceparent", "tracestate")  # W3C trace context, as HTTP headers carry it
UNAUTHENTICATED = "No valid auth token"  # TEI's gRPC answer to a missing or wrong key
# how long a failed stream reads what its client still sends before it ends (`drained`)
DRAIN_SECONDS = 2.0

# TEI's mapping (router/src/grpc/server.rs, `impl From<ErrorResponse> for Status`): Validation and
# Empty -> INVALID_ARGUMENT, Tokenizer and Backend -> FAILED_PRECONDITION, Overloaded ->
# RESOURCE_EXHAUSTED, Unhealthy -> UNAVAILABLE. prensa's own kinds: an unknown model is NOT_FOUND;
# a request over a size limit is RESOURCE_EXHAUSTED, as gRPC answers a message over its size limit.
STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.VALIDATION: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.EMPTY: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.TOKENIZER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.BACKEND: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.SENDING: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNHEALTHY: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
}


@dataclass(frozen=True)
class Malformed:
    """A request message protobuf could not parse (`lenient`), refused by its call after the key."""

    error: str


def lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`parse`, giving a `Malformed` instead of raising on bytes it cannot read."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or a bad UTF-8 string field
            return Malformed(str(exc) or type(exc).__name__)

    return deserialize


def parsed(message: Q) -> Q:
    """`message`, or a GatewayError (INVALID_ARGUMENT) for one that did not parse."""
    if isinstance(message, Malformed):
        raise GatewayError(
            ErrorKind.MALFORMED, f"the request message does not parse: {message.error}"
        )
    return message


class WrongModel(GatewayError):
    """The model cannot serve this RPC (an embedder asked to rerank): FAILED_PRECONDITION, as TEI
    answers a model of the wrong type, where HTTP says 422."""


def status(error: GatewayError) -> grpc.StatusCode:
    return (
        grpc.StatusCode.FAILED_PRECONDITION if isinstance(error, WrongModel) else STATUS[error.kind]
    )


@dataclass
class Call:
    """One RPC: its name, the model its metadata names, its request id, and what it did (its log line)."""

    rpc: str  # "/tei.v1.Embed/Embed"
    model: str | None
    request_id: str
    started: float
    trace_carrier: dict[str, str] = field(default_factory=dict)  # the client's traceparent, if any
    priority: Priority = Priority.ONLINE  # from PRIORITY_HEADER, as on HTTP
    client: str = ""  # the peer's connection: its calls and stream messages share one turn
    served: str = ""
    inputs: int = 0
    tokens: int = 0
    span: Span | None = None  # the call's server span, when traced

    def context(self, received: float) -> RequestContext:
        """A request the call makes (itself, or one message of a stream), received at `received`."""
        return RequestContext(
            received=received,
            request_id=self.request_id,
            priority=self.priority,
            client=self.client,
        )

    def add(self, request_context: RequestContext) -> None:
        """Count a request the call made (itself, or one message of a stream)."""
        self.served = request_context.model or self.served
        self.inputs += request_context.inputs
        self.tokens += request_context.tokens


def stream_context(call: Call, each: list[RequestContext]) -> RequestContext:
    """A client stream's context as TEI reports it: characters and tokens summed over its messages,
    tokenization, queue and inference times their means."""
    count = max(len(each), 1)
    return RequestContext(
        received=call.started,
        request_id=call.request_id,
        model=each[-1].model if each else "",
        inputs=sum(t.inputs for t in each),
        characters=sum(t.characters for t in each),
        tokens=sum(t.tokens for t in each),
        tokenization_s=sum(t.tokenization_s for t in each) / count,
        queue_s=sum(t.queue_s or 0.0 for t in each) / count,
        inference_s=sum(t.inference_s for t in each) / count,
    )


def _done(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a stream that failed no longer awaits its other messages


async def in_order(
    messages: AsyncIterator[Q], handle: Callable[[Q], Awaitable[R]], limit: int
) -> AsyncGenerator[R, None]:
    """`handle(message)` of every message, up to `limit` at once, yielded in the messages' order.
    Messages are read while earlier ones run; with `limit` unanswered, reading waits (gRPC's flow
    control then holds the client back). When one fails, the rest are cancelled and the messages
    the client is still sending are read and dropped (`drained`) before the failure ends the call;
    when the consumer stops, the rest are cancelled."""
    slots = asyncio.Semaphore(max(limit, 1))
    queue: asyncio.Queue[asyncio.Future[R] | None] = asyncio.Queue()
    failed = asyncio.Event()

    async def read() -> None:
        try:
            while True:
                if not failed.is_set():
                    await slots.acquire()
                try:
                    message = await anext(messages)
                except StopAsyncIteration:
                    return
                if not failed.is_set():
                    queue.put_nowait(asyncio.ensure_future(handle(message)))
        finally:
            queue.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (task := await queue.get()) is not None:
            try:
                result = await task
            except Exception:
                failed.set()
                await drained(reader, queue, slots)
                raise
            finally:
                slots.release()
            yield result
        await reader  # a stream that broke while being read fails the call
    finally:
        reader.cancel()
        reader.add_done_callback(_done)
        cancel_queued(queue)


def cancel_queued(queue: asyncio.Queue[asyncio.Future[R] | None]) -> None:
    while not queue.empty():
        if (left := queue.get_nowait()) is not None:
            left.cancel()
            left.add_done_callback(_done)


async def drained(
    reader: asyncio.Future[None],
    queue: asyncio.Queue[asyncio.Future[R] | None],
    slots: asyncio.Semaphore,
) -> None:
    """After a failed message, the client's remaining messages read and dropped, for at most
    `DRAIN_SECONDS`. A call ended while its client still writes reaches a grpc client as INTERNAL
    ("Internal error from Core": its write fails before it reads the status), not as the status the
    gateway chose; a client that stops writing (half-closes, or waits for answers) ends the wait."""
    cancel_queued(queue)
    slots.release()  # a reader waiting for a slot goes on, dropping what it reads
    with suppress(Exception):  # the wait timed out, or reading broke: the failure ends the call
        await asyncio.wait_for(asyncio.shield(reader), DRAIN_SECONDS)


class Calls:
    """The RPC plumbing of one gateway process (TEI's dialect, `apis.tei.grpc`, hands it each RPC's work)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.metrics = gateway.metrics

    async def open(self, context: Any, rpc: str) -> Call:
        """The call's metadata read once; a missing or wrong API key ends it UNAUTHENTICATED (TEI's
        interceptor), before anything else is looked at."""
        metadata: dict[str, str] = {}
        keys: list[str] = []
        for key, value in context.invocation_metadata() or ():
            if isinstance(value, str):  # "-bin" keys carry bytes; none of them is read here
                metadata.setdefault(key, value)
                keys.append(key)
        # two keys are no key (as two Authorization headers on HTTP): neither is taken over the other
        if self.settings.api_key and (
            keys.count(AUTH_KEY) != 1 or not key_matches(metadata[AUTH_KEY], self.settings.api_key)
        ):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
        headers = [
            (key.encode(), metadata[key].encode("latin-1", "replace"))
            for key in (REQUEST_ID_HEADER.decode(), "traceparent")
            if key in metadata
        ]
        carrier = {key: metadata[key] for key in TRACE_KEYS if key in metadata}
        call = Call(
            rpc, metadata.get(MODEL_KEY) or None, request_id(headers), time.perf_counter(), carrier
        )
        call.client = context.peer() or ""
        if self.settings.priority and PRIORITY_HEADER in metadata:
            named = Priority.named(metadata[PRIORITY_HEADER])
            if named is None:
                refusal = priority_refusal(metadata[PRIORITY_HEADER])
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
            call.priority = named or Priority.ONLINE
        return call

    @contextmanager
    def traced(self, call: Call) -> Iterator[None]:
        """The call under a server span of its own, with --otlp-endpoint (see `tracing.rpc_span`)."""
        with rpc_span(self.gateway.tracer, call.rpc, call.trace_carrier, call.started) as span:
            call.span = span
            yield

    async def unary(self, message: Q, context: Any, rpc: str, method: str, work: Work[Q, R]) -> R:
        call = await self.open(context, rpc)
        request_context = call.context(call.started)
        self.metrics.started(method)
        with self.traced(call), self.hang_up_logged(call):
            try:
                reply = await work(parsed(message), call.model, request_context)
            except GatewayError as error:
                await self.fail(context, call, error)
            call.add(request_context)
            self.log(call, grpc.StatusCode.OK)
        record_success(self.metrics, method, request_context)
        await context.send_initial_metadata(
            [*timing_headers(request_context).items(), *self._id(call)]
        )
        return reply

    async def stream(
        self, messages: AsyncIterator[Q], context: Any, rpc: str, method: str, work: Work[Q, R]
    ) -> AsyncIterator[R]:
        """A bidirectional stream: one answer per message, in order."""
        call = await self.open(context, rpc)
        await context.send_initial_metadata(self._id(call))
        replies = in_order(
            messages,
            lambda message: self._message(call, method, work, message),
            self.settings.max_client_batch_size,
        )
        with self.traced(call), self.hang_up_logged(call):
            try:
                # closed now, its calls cancelled, when the client hangs up
                async with aclosing(replies):
                    async for reply in replies:
                        yield reply
            except GatewayError as error:
                await self.fail(context, call, error)
            self.log(call, grpc.StatusCode.OK)

    async def gathered(
        self,
        messages: AsyncIterator[Q],
        context: Any,
        rpc: str,
        method: str,
        work: Work[Q, R],
        combine: Callable[[list[R], RequestContext], Any],
    ) -> Any:
        """A client stream answered once: `combine` of every message's result and of `stream_context`,
        counted as one request."""
        call = await self.open(context, rpc)
        self.metrics.started(method)
        each: list[RequestContext] = []

        async def part(message: Q) -> R:
            each.append(request_context := call.context(time.perf_counter()))
            return await work(parsed(message), call.model, request_context)

        results = in_order(messages, part, self.settings.max_client_batch_size)
        with self.traced(call), self.hang_up_logged(call):
            try:
                async with aclosing(results):
                    parts = [result async for result in results]
                total = stream_context(call, each)
                reply = combine(parts, total)
            except GatewayError as error:
                await self.fail(context, call, error)
            call.add(total)
            self.log(call, grpc.StatusCode.OK)
        record_success(self.metrics, method, total)
        await context.send_initial_metadata([*timing_headers(total).items(), *self._id(call)])
        return reply

    async def _message(self, call: Call, method: str, work: Work[Q, R], message: Q) -> R:
        """One message of a stream: a request of its own, counted under `method` as HTTP counts its routes."""
        request_context = call.context(time.perf_counter())
        self.metrics.started(method)
        reply = await work(parsed(message), call.model, request_context)
        record_success(self.metrics, method, request_context)
        call.add(request_context)
        return reply

    @contextmanager
    def hang_up_logged(self, call: Call) -> Iterator[None]:
        """A call cancelled (its client hung up, or the server stopped) still gets its log line."""
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):  # a stream is closed, not cancelled
            self.log(call, grpc.StatusCode.CANCELLED)
            raise

    @staticmethod
    def _id(call: Call) -> list[tuple[str, str]]:
        return [(REQUEST_ID_HEADER.decode(), call.request_id)]

    async def fail(self, context: Any, call: Call, error: GatewayError) -> NoReturn:
        """End the call with `error`'s status and message (TEI's messages), counted and logged."""
        self.metrics.request_failure.inc(error.kind.value)
        code = status(error)
        self.log(call, code, error.message)
        await context.abort(code, error.message, trailing_metadata=tuple(self._id(call)))
        raise AssertionError("context.abort returned")  # it raises; this tells the type checker so

    def log(self, call: Call, code: grpc.StatusCode, error: str = "") -> None:
        """The access log's line for the call, as `logs.RequestLog` writes one per HTTP request,
        and the same fields on its span."""
        fault = code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
        if call.span is not None:
            call.span.set_attributes(
                {
                    "rpc.grpc.status_code": code.value[0],
                    "prensa.request_id": call.request_id,
                    "prensa.model": call.served,
                    "prensa.inputs": call.inputs,
                    "prensa.tokens": call.tokens,
                }
            )
            if fault:  # as an HTTP 5xx: the server's fault, not the client's
                call.span.set_status(StatusCode.ERROR, error)
        level = logging.WARNING if fault else logging.INFO
        if not self.settings.access_log or not access.isEnabledFor(level):
            return
        total_ms = round((time.perf_counter() - call.started) * 1000, 2)
        fields: dict[str, Any] = {
            "request_id": call.request_id,
            "method": "GRPC",
            "path": call.rpc,
            "status": code.name,
            "total_ms": total_ms,
            "model": call.served,
            "inputs": call.inputs,
            "tokens": call.tokens,
        }
        if error:
            fields["error"] = error
        access.log(
            level, "GRPC %s %s %.1f ms", call.rpc, code.name, total_ms, extra={"fields": fields}
        )
