"""What tracing costs a lone query: three `prensa gateway`s on one Triton (its OpenTelemetry tracing
on, as `prensa serve --otlp-endpoint` starts it), one without `--otlp-endpoint`, one tracing every
request, one tracing none (`--otlp-sample-rate 0`), asked in turn, so that all three see the same
machine at the same moment. Spans go to a sink in this process that accepts and drops them.

    .venv/bin/python tools/trace_cost.py --repo model_repo --model minilm --requests 500
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from prensa.addresses import free_port
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.tracing import NEVER, TritonTracing

TEXT = "which bridge crosses the river by the old mill?"


class Drop(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):  # noqa: N802 - gRPC's names
        return trace_service_pb2.ExportTraceServiceResponse()


class DropHttp(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="a repository from `prensa repo build`")
    parser.add_argument("--model", default="minilm", help="an embedding model of REPO")
    parser.add_argument("--requests", type=int, default=500, help="requests per gateway, after 50 to warm up")
    args = parser.parse_args()

    sink = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Drop(), sink)
    grpc_port = sink.add_insecure_port("127.0.0.1:0")
    sink.start()
    http_sink = ThreadingHTTPServer(("127.0.0.1", 0), DropHttp)
    threading.Thread(target=http_sink.serve_forever, daemon=True).start()
    tracing = TritonTracing(f"http://127.0.0.1:{http_sink.server_address[1]}/v1/traces", "prensa-triton", NEVER)
    ports = TritonPorts(free_port(), free_port(), free_port())
    endpoint = ["--otlp-endpoint", f"http://127.0.0.1:{grpc_port}"]
    variants = {"off": [], "every request": endpoint, "no request sampled": [*endpoint, "--otlp-sample-rate", "0"]}
    prensa = str(Path(sys.executable).with_name("prensa"))
    with TritonProcess(TritonOptions(args.repo, ports=ports, tracing=tracing)) as triton:
        gateways, urls = [], {}
        for name, flags in variants.items():
            port = free_port()
            gateways.append(subprocess.Popen([prensa, "gateway", "--triton-url", triton.grpc_url, "--repo", str(args.repo),
                                              "--port", str(port), "--no-access-log", "--default-model", args.model,
                                              *flags], stderr=subprocess.DEVNULL))
            urls[name] = f"http://127.0.0.1:{port}"
        try:
            for url in urls.values():
                wait_healthy(url)
            clients = {name: httpx.Client(base_url=url, timeout=30) for name, url in urls.items()}
            seconds: dict[str, list[float]] = {name: [] for name in urls}
            for turn in range(50 + args.requests):
                for name, client in clients.items():
                    started = time.perf_counter()
                    client.post("/embed", json={"inputs": TEXT}).raise_for_status()
                    if turn >= 50:
                        seconds[name].append(time.perf_counter() - started)
        finally:
            for gateway in gateways:
                gateway.terminate()
                gateway.wait(30)
    sink.stop(grace=None)
    http_sink.shutdown()
    base = statistics.median(seconds["off"])
    print(f"{'tracing':<20} {'p50 ms':>8} {'mean ms':>8} {'p50 vs off':>11}")
    for name, values in seconds.items():
        print(f"{name:<20} {statistics.median(values) * 1000:8.2f} {statistics.mean(values) * 1000:8.2f} "
              f"{statistics.median(values) / base:11.3f}")


if __name__ == "__main__":
    main()
