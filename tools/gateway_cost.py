"""The gateway's own CPU per request: the real app (middleware, routing, validation, tokenization,
serialization) driven as ASGI in this process, no HTTP server and no network, over the
in-process backend with every model answer memoised after its first call, so nothing but the
gateway's code runs per request. Prints microseconds per request (best and median of 5 rounds).

With `--http`, the same app behind its real HTTP server (uvicorn with prensa's connection
protocol, the access log on) in a child process, driven over loopback by `--concurrency` aiohttp
clients with distinct short queries, merging off (merged calls would miss the memo): the child's
CPU per request and the requests per second one core of it answers, the gateway's own ceiling.

    .venv/bin/python tools/gateway_cost.py --repo model_repo --model minilm --requests 2000
    .venv/bin/python tools/gateway_cost.py --repo model_repo --model minilm --http --concurrency 64
    .venv/bin/python tools/gateway_cost.py --repo model_repo --model minilm --http --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import orjson

from prensa.addresses import LOOPBACK, free_port, http_url
from prensa.bench.load import LoadResult, Workload, closed_loop
from prensa.bench.systems import HttpClient, ServerProcess
from prensa.gateway.app import create_app
from prensa.gateway.local_backend import InProcessBackend
from prensa.gateway.logs import configure_logging
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.workers import gateway_server
from prensa.workload import query_texts

TEXT = "how are module attributes looked up?"


class Memoised(InProcessBackend):
    """Runs each distinct call once, then answers it from memory (texts keyed by value: an object
    array's bytes are its pointers)."""

    answers: ClassVar[dict[Any, dict[str, Any]]] = {}

    async def infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str],
                    request_id: str = "") -> dict[str, Any]:
        key = (model, tuple((name, value.shape,
                             tuple(value.reshape(-1).tolist()) if value.dtype == object else value.tobytes())
                            for name, value in inputs.items()), tuple(outputs))
        if key not in self.answers:
            self.answers[key] = await super().infer(model, inputs, outputs, request_id)
        return self.answers[key]


async def request(app: Any, path: str, body: bytes) -> None:
    done, sent = asyncio.Event(), []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    headers = [(b"host", b"gateway"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
               "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
               "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}, receive, send)
    if sent[0]["status"] != 200:
        raise SystemExit(f"{path} answered {sent[0]['status']}: {sent[1].get('body', b'')[:300]!r}")


async def measure(repo: Path, model: str, requests: int) -> list[float]:
    settings = GatewaySettings(repo=repo, default_model=model, access_log=False)
    app = create_app(settings, environ={}, backend=lambda s: Memoised(s.repo, s.triton_timeout_s))
    startup = [{"type": "lifespan.startup"}]
    started, stop = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        if startup:
            return startup.pop()
        await stop.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.failed":
            raise SystemExit(message.get("message"))
        if message["type"] == "lifespan.startup.complete":
            started.set()

    lifespan = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
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


def serve(repo: Path, model: str, port: int, workers: int) -> None:
    """The gateway's real server, as `prensa gateway` runs it, on the memoised backend (the `--http` child)."""
    settings = GatewaySettings(repo=repo, default_model=model, max_concurrent_requests=1_000_000,
                               coalesce_requests=False, workers=workers)
    configure_logging(settings.log_level, settings.json_output)
    gateway_server(settings, LOOPBACK, port, backend=memoised).run()


def measure_http(repo: Path, model: str, requests: int, concurrency: int, log: Path,
                 workers: int = 1) -> tuple[float, float, float, float]:
    """CPU ms per request and requests per second of the served gateway (all its workers) at
    `concurrency` clients, and the cores it and the load generator kept busy meanwhile."""
    port = free_port()
    server = ServerProcess([sys.executable, __file__, "--repo", str(repo), "--model", model, "--serve", str(port),
                            "--workers", str(workers)], http_url(port, "/health"), log)
    server.start()
    client = HttpClient("gateway", server.base_url, model, "tei")
    items = [[text] for text in query_texts(200)]
    work = Workload((items * (requests // len(items) + 1))[:requests], [1] * requests, [1] * requests)

    async def run() -> LoadResult:
        await client.open()
        try:
            # the memo, filled in every worker: each pass spreads the texts over them anew
            memo = items * (4 * workers if workers > 1 else 1)
            await closed_loop(client.embed, Workload(memo, [1] * len(memo), [1] * len(memo)), concurrency)
            return await closed_loop(client.embed, work, concurrency, [server.pid])
        finally:
            await client.close()

    try:
        result = asyncio.run(run())
    finally:
        server.stop()
    if result.errors or result.server_cpu_s is None:
        raise SystemExit(f"{result.errors} requests failed; see {log}")
    return (result.server_cpu_s * 1000 / result.requests, result.requests / result.seconds,
            result.server_cpu_s / result.seconds, result.client_cpu_s / result.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="A rendered model repository (`prensa repo build`).")
    parser.add_argument("--model", required=True, help="An embedding model in it.")
    parser.add_argument("--requests", type=int, default=2000, help="Requests per round (5 rounds; --http: one run).")
    parser.add_argument("--http", action="store_true", help="Through the real HTTP server, over loopback.")
    parser.add_argument("--concurrency", type=int, default=64, help="--http: concurrent clients.")
    parser.add_argument("--log", type=Path, default=Path("gateway-cost.log"), help="--http: the server's log.")
    parser.add_argument("--workers", type=int, default=1, help="--http: gateway worker processes.")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the --http child, on this port
    args = parser.parse_args()
    if args.serve:
        serve(args.repo, args.model, args.serve, args.workers)
    elif args.http:
        cpu_ms, rate, cores, client = measure_http(args.repo, args.model, args.requests, args.concurrency, args.log,
                                                   args.workers)
        print(f"gateway over HTTP at {args.concurrency} clients, {args.workers} worker(s): {cpu_ms * 1000:.0f} us CPU "
              f"per /embed request, {rate:.0f} requests/s ({1000 / cpu_ms:.0f} per second of CPU); cores busy: "
              f"gateway {cores:.2f}, load generator {client:.2f}")
    else:
        rounds = asyncio.run(measure(args.repo, args.model, args.requests))
        print(f"gateway CPU per /embed request: best {min(rounds):.0f} us, median {statistics.median(rounds):.0f} us")


if __name__ == "__main__":
    main()
