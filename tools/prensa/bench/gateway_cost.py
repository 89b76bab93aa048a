"""The gateway's own CPU per request (`prensa bench gateway`).

In process: the real app (middleware, routing, validation, tokenization, serialization) driven as
ASGI, no HTTP server and no network, over the in-process backend with every model answer memoised
after its first call, so nothing but the gateway's code runs per request.

Over HTTP: the same app behind its real server (uvicorn with prensa's connection protocol, the
access log on) in a child process, driven over loopback by concurrent clients with distinct short
queries, merging off (merged calls would miss the memo): the child's CPU per request and the
requests per second one core of it answers, the gateway's own ceiling. With `grpc`, the same
server's TEI gRPC API (`--tei-grpc-port`) takes the same queries as unary `tei.v1.Embed/Embed`
calls over one channel, as a gRPC client sends them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson

from prensa.addresses import LOOPBACK, free_port, http_url
from prensa.bench.load import LoadResult, Workload, closed_loop
from prensa.bench.systems import HttpClient, ServerProcess
from prensa.gateway.app import create_app
from prensa.gateway.backends.local import InProcessBackend
from prensa.gateway.logs import configure_logging
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.workers import gateway_server
from prensa.workload import query_texts

TEXT = "how are module attributes looked up?"


class Memoised(InProcessBackend):
    """Runs each distinct call once, then answers it from memory (texts keyed by value: an object
    array's bytes are its pointers)."""

    answers: ClassVar[dict[Any, dict[str, Any]]] = {}

    async def infer(
        self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str], request_id: str = ""
    ) -> dict[str, Any]:
        key = (
            model,
            tuple(
                (
                    name,
                    value.shape,
                    tuple(value.reshape(-1).tolist()) if value.dtype == object else value.tobytes(),
                )
                for name, value in inputs.items()
            ),
            tuple(outputs),
        )
        if key not in self.answers:
            self.answers[key] = await super().infer(model, inputs, outputs, request_id)
        return self.answers[key]


Message = MutableMapping[str, Any]


class RequestFailed(RuntimeError):
    """The gateway answered a measured request with an error: the figures would not be its cost."""


async def request(app: Any, path: str, body: bytes) -> None:
    done, sent = asyncio.Event(), list[Message]()
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    headers = [
        (b"host", b"gateway"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
    }
    await app(scope, receive, send)
    if sent[0]["status"] != 200:
        raise RequestFailed(
            f"{path} answered {sent[0]['status']}: {sent[1].get('body', b'')[:300]!r}"
        )


async def measure(repo: Path, model: str, requests: int) -> list[float]:
    """Microseconds per /embed request in each of 5 rounds of `requests`, after 300 to warm up."""
    settings = GatewaySettings(repo=repo, default_model=model, access_log=False)
    app = create_app(settings, environ={}, backend=lambda s: Memoised(s.repo, s.triton_timeout_s))
    startup: list[Message] = [{"type": "lifespan.startup"}]
    started, stop = asyncio.Event(), asyncio.Event()

    async def receive() -> Message:
        if startup:
            return startup.pop()
        await stop.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed":
            raise RequestFailed(str(message.get("message")))
        if message["type"] == "lifespan.startup.complete":
            started.set()

    lifespan = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    )
    await started.wait()
    body = orjson.dumps({"inputs": TEXT})
    for _ in range(300):  # warm: the memo filled, the code paths run
        await request(app, "/embed", body)
    rounds = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(requests):
            await request(app, "/embed", body)
        rounds.append((time.perf_counter() - began) / requests * 1e6)
    stop.set()
    await lifespan
    return rounds


def memoised(settings: GatewaySettings) -> Memoised:
    """The backend of each gateway worker (a function of this module: workers are spawned)."""
    return Memoised(settings.repo, settings.triton_timeout_s)


def serve(repo: Path, model: str, port: int, workers: int, grpc_port: int | None) -> None:
    """The gateway's real server, as `prensa gateway` runs it, on the memoised backend (the child of
    `measure_http`, run as `python -m prensa.bench.gateway_cost REPO MODEL PORT WORKERS [GRPC_PORT]`)."""
    settings = GatewaySettings(
        repo=repo,
        default_model=model,
        max_concurrent_requests=1_000_000,
        coalesce_requests=False,
        workers=workers,
        tei_grpc_port=grpc_port,
    )
    configure_logging(settings.log_level, settings.json_output)
    gateway_server(settings, LOOPBACK, port, backend=memoised).run()


class TeiGrpcClient:
    """TEI's gRPC `Embed`, one text a call, over one channel (as `HttpClient.embed` sends `/embed`)."""

    def __init__(self, port: int) -> None:
        self.address = f"{LOOPBACK}:{port}"
        self.channel: Any = None
        self.stub: Any = None
        self.message: Any = None  # tei_pb2.EmbedRequest

    async def open(self) -> None:
        import grpc

        from prensa.gateway.grpc import tei_pb2, tei_pb2_grpc

        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = tei_pb2_grpc.EmbedStub(self.channel)
        self.message = tei_pb2.EmbedRequest

    async def close(self) -> None:
        await self.channel.close()

    async def embed(self, item: list[str]) -> None:
        await self.stub.Embed(self.message(inputs=item[0]))


@dataclass(frozen=True)
class HttpCost:
    """The served gateway (all its workers) at some number of clients."""

    cpu_ms_per_request: float
    requests_per_s: float
    gateway_cores: float  # cores it kept busy
    client_cores: float  # and the load generator

    @property
    def requests_per_cpu_s(self) -> float:
        return 1000 / self.cpu_ms_per_request


def measure_http(
    repo: Path,
    model: str,
    requests: int,
    concurrency: int,
    log: Path,
    workers: int = 1,
    grpc: bool = False,
) -> HttpCost:
    """The served gateway's cost at `concurrency` clients, each request answered from the memo:
    `/embed` over HTTP, or with `grpc` TEI's gRPC `Embed`."""
    port, grpc_port = free_port(), free_port() if grpc else None
    server = ServerProcess(
        [sys.executable, "-m", __name__, str(repo), model, str(port), str(workers)]
        + ([str(grpc_port)] if grpc_port else []),
        http_url(port, "/health"),
        log,
    )
    server.start()
    client: HttpClient | TeiGrpcClient = (
        TeiGrpcClient(grpc_port)
        if grpc_port
        else HttpClient("gateway", server.base_url, model, "tei")
    )
    items = [[text] for text in query_texts(200)]
    work = Workload(
        (items * (requests // len(items) + 1))[:requests], [1] * requests, [1] * requests
    )

    async def run() -> LoadResult:
        await client.open()
        try:
            # the memo, filled in every worker: each pass spreads the texts over them anew
            memo = items * (4 * workers if workers > 1 else 1)
            await closed_loop(
                client.embed, Workload(memo, [1] * len(memo), [1] * len(memo)), concurrency
            )
            return await closed_loop(client.embed, work, concurrency, [server.pid])
        finally:
            await client.close()

    try:
        result = asyncio.run(run())
    finally:
        server.stop()
    if result.errors or result.server_cpu_s is None:
        raise RequestFailed(f"{result.errors} requests failed; see {log}")
    return HttpCost(
        result.server_cpu_s * 1000 / result.requests,
        result.requests / result.seconds,
        result.server_cpu_s / result.seconds,
        result.client_cpu_s / result.seconds,
    )


if __name__ == "__main__":  # the served gateway of `measure_http`
    grpc_port = int(sys.argv[5]) if len(sys.argv) > 5 else None
    serve(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), grpc_port)
