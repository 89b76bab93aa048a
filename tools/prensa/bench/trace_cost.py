"""What tracing costs a lone query (`prensa bench tracing`).

Three `prensa gateway`s on one Triton (its OpenTelemetry tracing on, as `prensa serve
--otlp-endpoint` starts it): one without `--otlp-endpoint`, one tracing every request, one tracing
none (`--otlp-sample-rate 0`), asked in turn, so that all three see the same machine at the same
moment. Spans go to a sink in this process that accepts and drops them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from prensa.addresses import LOOPBACK, free_port, http_url
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.tracing import NEVER, TritonTracing

TEXT = "which bridge crosses the river by the old mill?"
WARMUP = 50  # requests per gateway before measuring


class Drop(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:  # noqa: N802
        return trace_service_pb2.ExportTraceServiceResponse()


class DropHttp(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class NotHealthy(RuntimeError):
    """A gateway of the comparison did not start."""


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise NotHealthy(f"{url} did not become healthy")


@contextmanager
def span_sinks() -> Iterator[tuple[str, str]]:
    """OTLP endpoints that accept spans and drop them: (gRPC, HTTP traces URL)."""
    sink = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Drop(), sink)  # type: ignore[no-untyped-call]
    grpc_port = sink.add_insecure_port(f"{LOOPBACK}:0")
    sink.start()
    http_sink = ThreadingHTTPServer((LOOPBACK, 0), DropHttp)
    threading.Thread(target=http_sink.serve_forever, daemon=True).start()
    try:
        yield http_url(grpc_port), http_url(http_sink.server_address[1], "/v1/traces")
    finally:
        sink.stop(grace=None)
        http_sink.shutdown()


def measure(repo: Path, model: str, requests: int) -> dict[str, list[float]]:
    """Seconds per /embed request of `model`, per tracing variant, `requests` each after the warm-up."""
    prensa = str(Path(sys.executable).with_name("prensa"))
    with span_sinks() as (grpc_sink, http_sink):
        tracing = TritonTracing(http_sink, "prensa-triton", NEVER)
        endpoint = ["--otlp-endpoint", grpc_sink]
        variants = {
            "off": [],
            "every request": endpoint,
            "no request sampled": [*endpoint, "--otlp-sample-rate", "0"],
        }
        ports = TritonPorts(free_port(), free_port(), free_port())
        with TritonProcess(TritonOptions(repo, ports=ports, tracing=tracing)) as triton:
            gateways, urls = [], {}
            for name, flags in variants.items():
                port = free_port()
                gateways.append(
                    subprocess.Popen(
                        [
                            prensa,
                            "gateway",
                            "--triton-url",
                            triton.grpc_url,
                            "--repo",
                            str(repo),
                            "--port",
                            str(port),
                            "--no-access-log",
                            "--default-model",
                            model,
                            *flags,
                        ],
                        stderr=subprocess.DEVNULL,
                    )
                )
                urls[name] = http_url(port)
            try:
                for url in urls.values():
                    wait_healthy(url)
                clients = {
                    name: httpx.Client(base_url=url, timeout=30) for name, url in urls.items()
                }
                seconds: dict[str, list[float]] = {name: [] for name in urls}
                for turn in range(WARMUP + requests):
                    for name, client in clients.items():
                        started = time.perf_counter()
                        client.post("/embed", json={"inputs": TEXT}).raise_for_status()
                        if turn >= WARMUP:
                            seconds[name].append(time.perf_counter() - started)
            finally:
                for gateway in gateways:
                    gateway.terminate()
                    gateway.wait(30)
    return seconds
