"""Gateways on free loopback ports in front of the session's real Triton, and direct Triton calls
to compare them with."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry
from tokenizers import Tokenizer

from prensa.addresses import free_port
from prensa.gateway.server import worker_server
from prensa.gateway.settings import GatewaySettings


@contextmanager
def running_gateway(settings: GatewaySettings, other_metrics: Sequence[CollectorRegistry] = ()) -> Iterator[str]:
    """The gateway under uvicorn in a thread, as `prensa gateway` runs each worker (with `other_metrics`
    on its /metrics, as `prensa serve` adds its supervisor's); stopped on exit."""
    port = free_port()
    server = worker_server(settings, "127.0.0.1", port, other_metrics)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="session")
def settings(triton) -> GatewaySettings:
    # all-MiniLM-L6-v2 declares no Matryoshka sizes: the tests of `dimensions` run with the operator's switch
    return GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, default_model="minilm",
                           allow_any_dimensions=True)


@pytest.fixture(scope="session")
def gateway(settings) -> Iterator[str]:
    with running_gateway(settings) as url:
        yield url


@pytest.fixture(scope="session")
def http(gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway, timeout=60) as client:
        yield client


@pytest.fixture
def start_gateway(settings) -> Iterator[Callable[..., str]]:
    """Start extra gateways with some settings changed; all stop at the end of the test."""
    with ExitStack() as stack:
        yield lambda **changes: stack.enter_context(running_gateway(replace(settings, **changes)))


@pytest.fixture(scope="session")
def direct(triton) -> Callable[..., dict[str, np.ndarray]]:
    """Call a Triton ensemble directly: the reference every gateway answer is compared with."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)

    def infer(model: str, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray]:
        inputs = []
        for name, values in (("text", texts), ("text_pair", pairs)):
            if values is not None:
                tensor = grpcclient.InferInput(name, [len(values), 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[v.encode()] for v in values], dtype=object))
                inputs.append(tensor)
        result = client.infer(model, inputs)
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}

    return infer


@pytest.fixture(scope="session")
def tokenizer(exports) -> Callable[[str], Tokenizer]:
    """The exported model's own tokenizer file, through the `tokenizers` library."""

    def load(model: str) -> Tokenizer:
        tok = Tokenizer.from_file(str(Path(exports[model]) / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        return tok

    return load


@pytest.fixture
def need(exports) -> Callable[[str], None]:
    """Skip a test whose model the session's Triton does not serve (yet)."""

    def check(model: str) -> None:
        if model not in exports:
            pytest.skip(f"tests/conftest.py's `exports` has no `{model}` model yet")

    return check


class TcpForwarder:
    """A loopback TCP relay to Triton's gRPC port that can be cut, to make Triton vanish mid-session."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        for sock in [self.listener, *self.sockets]:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
