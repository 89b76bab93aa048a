"""Security: Triton and the gateway bind loopback unless told otherwise, the API key guards every
route of the app's route table (compared in constant time), error bodies leak no path or stack,
and the body limit is enforced before the body is even read."""

from __future__ import annotations

import hmac
import inspect
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import BaseRoute, Route

from prensa.addresses import free_port
from prensa.cli.gateway import gateway as gateway_command
from prensa.cli.serve import serve as serve_command
from prensa.gateway import auth
from prensa.gateway.app import create_app
from prensa.gateway.backends.triton import public_message
from prensa.gateway.http import middleware
from prensa.gateway.settings import GatewaySettings
from prensa.triton.launcher import TritonOptions, triton_command
from tests.reliability.conftest import assert_no_leak, listens_on_loopback_only

pytestmark = pytest.mark.triton
KEY = "s3cret-key"


def test_triton_binds_loopback_by_default(triton):
    command = triton_command(TritonOptions(Path("repo")))
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        assert f"{flag}=127.0.0.1" in command
    assert listens_on_loopback_only(triton.process.pid)
    for command_function, parameter in ((gateway_command, "host"), (serve_command, "host"),
                                        (serve_command, "gateway_host")):
        assert inspect.signature(command_function).parameters[parameter].default == "127.0.0.1"


def test_api_key_is_compared_in_constant_time(monkeypatch):
    compared, constant_time = [], hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return constant_time(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.key_matches(f"Bearer {KEY}", KEY) and not auth.key_matches("Bearer nope", KEY)
    assert compared == [(KEY.encode(), KEY.encode()), (b"nope", KEY.encode())]


def flat_routes(routes: list[BaseRoute]) -> Iterator[Route]:
    """Every endpoint, with included routers opened up (the gateway's routers have no prefix)."""
    for route in routes:
        if isinstance(route, Route):
            yield route
        else:
            yield from flat_routes(route.original_router.routes)


def test_every_route_but_the_open_ones_needs_the_key(gateway_on):
    """Walks the app's own route table: a route added later without the key fails here."""
    assert {"/health", "/", "/ping", "/v1/health/ready", "/v1/health/live", "/metrics", "/docs",
            "/docs/oauth2-redirect", "/openapi.json"} == middleware.OPEN_PATHS
    url = gateway_on(api_key=KEY)
    routes = [(method, route.path) for route in flat_routes(create_app(GatewaySettings()).routes)
              for method in route.methods - {"HEAD"}]
    open_routes = [(method, path) for method, path in routes
                   if method in middleware.OPEN_METHODS and path in middleware.OPEN_PATHS]
    guarded = [route for route in routes if route not in open_routes]
    assert {"/v1/embeddings", "/embeddings", "/v1/rerank", "/v2/rerank", "/v1/ranking", "/v2/embed", "/tokenize",
            "/decode", "/embed_colbert", "/info", "/", "/invocations", "/vertex", "/v1/models", "/api/embed",
            "/api/embeddings", "/api/tags", "/api/show"} <= {
        path for _, path in guarded}
    assert ("POST", "/") in guarded
    for method, path in guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
            response = httpx.request(method, f"{url}{path}", json={}, headers=headers)
            assert (response.status_code, response.content) == (401, b""), (method, path, headers)
        keyed = httpx.request(method, f"{url}{path}", json={}, headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status_code != 401, (method, path)
    for method, path in open_routes:
        assert httpx.request(method, f"{url}{path}").status_code == 200, path


def test_error_bodies_leak_no_path_or_trace(gateway_on, triton, tmp_path):
    repo = triton.options.repo
    no_tokenizers = gateway_on(repo=tmp_path)
    dead_triton = gateway_on(triton_url=f"127.0.0.1:{free_port()}")
    failures = [
        httpx.post(f"{no_tokenizers}/tokenize", json={"inputs": "needs the tokenizer file"}),  # 422 Tokenizer
        httpx.post(f"{no_tokenizers}/embed", json={"inputs": [[101, 10**7, 102]]}),  # 424 from the encoder
        httpx.post(f"{dead_triton}/embed", json={"inputs": "ok"}),  # 503
        httpx.get(f"{dead_triton}/health"),
        httpx.post(f"{no_tokenizers}/embed?model=nope", json={"inputs": "ok"}),
        httpx.post(f"{no_tokenizers}/embed", content=b"{", headers={"content-type": "application/json"}),
    ]
    assert [r.status_code for r in failures] == [422, 424, 503, 503, 404, 400]
    for response in failures:
        assert_no_leak(response.content, repo, tmp_path)


def test_python_backend_traces_are_cut_from_messages():
    message = ("Failed to process the request(s) for model 'm_encode_0_0', message: ValueError: bad row\n\nAt:\n"
               "  /srv/models/m_encode/1/model.py(181): execute\n")
    assert public_message(message) == "Failed to process the request(s) for model 'm_encode_0_0', message: ValueError: bad row"
    assert public_message("cannot open /srv/models/m_encode/1/model.onnx: denied") == "cannot open <path>: denied"
    assert public_message("see http://127.0.0.1:8000/v2 and a/b") == "see http://127.0.0.1:8000/v2 and a/b"


def test_body_limit_is_enforced_before_reading_the_body(gateway_on):
    """A declared 1 GB body is refused from the headers alone: no byte of it is awaited or parsed."""
    host, port = gateway_on(payload_limit=1000).removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 2
