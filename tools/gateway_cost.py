"""The gateway's own CPU per request: the real app (middleware, routing, validation, tokenization,
serialization) driven as ASGI in this process, no HTTP server and no network, over the
in-process backend with every model answer memoised after its first call, so nothing but the
gateway's code runs per request. Prints microseconds per request (best and median of 5 rounds).

    .venv/bin/python tools/gateway_cost.py --repo model_repo --model minilm --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import orjson

from prensa.gateway.app import create_app
from prensa.gateway.local_backend import InProcessBackend
from prensa.gateway.settings import GatewaySettings

TEXT = "how are module attributes looked up?"


class Memoised(InProcessBackend):
    """Runs each distinct call once, then answers it from memory."""

    answers: ClassVar[dict[Any, dict[str, Any]]] = {}

    async def infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str],
                    request_id: str = "") -> dict[str, Any]:
        key = (model, tuple((name, value.tobytes()) for name, value in inputs.items()), tuple(outputs))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="A rendered model repository (`prensa repo build`).")
    parser.add_argument("--model", required=True, help="An embedding model in it.")
    parser.add_argument("--requests", type=int, default=2000, help="Requests per round (5 rounds).")
    args = parser.parse_args()
    rounds = asyncio.run(measure(args.repo, args.model, args.requests))
    print(f"gateway CPU per /embed request: best {min(rounds):.0f} us, median {statistics.median(rounds):.0f} us")


if __name__ == "__main__":
    main()
