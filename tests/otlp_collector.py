"""An OpenTelemetry collector inside the test process, on loopback: OTLP over gRPC (the gateway's
default exporter) and over HTTP, as protobuf or as JSON (Triton's exporter posts JSON). It keeps
every span it receives, with its service name, for tests to look at."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def _json_value(value: dict[str, Any]) -> Any:
    ((kind, item),) = value.items()
    return int(item) if kind == "intValue" else item


class Collector:
    """Start with `with Collector() as collector:`; `grpc_endpoint`, `http_endpoint`, `spans`."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.exports: list[str] = []  # how each export arrived: "grpc", "http/json", "http/protobuf"
        self._lock = threading.Lock()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> Collector:
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=None)
        self._http.shutdown()

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def add_protobuf(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(Span(resource.get("service.name", ""), s.name, s.trace_id.hex(), s.span_id.hex(),
                                      s.parent_span_id.hex(), KINDS[s.kind], s.start_time_unix_nano,
                                      s.end_time_unix_nano, {a.key: _value(a.value) for a in s.attributes},
                                      tuple(e.name for e in s.events)))
        with self._lock:
            self.spans.extend(spans)

    def add_json(self, body: dict[str, Any]) -> None:
        """OTLP/JSON: ids are hex strings, enums numbers, 64-bit integers strings."""
        spans = []
        for resource_spans in body.get("resourceSpans", []):
            resource = {a["key"]: _json_value(a["value"]) for a in resource_spans.get("resource", {}).get("attributes", [])}
            for scope_spans in resource_spans.get("scopeSpans", []):
                for s in scope_spans.get("spans", []):
                    spans.append(Span(resource.get("service.name", ""), s["name"], s["traceId"].lower(),
                                      s["spanId"].lower(), s.get("parentSpanId", "").lower(), KINDS[int(s.get("kind", 0))],
                                      int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                                      {a["key"]: _json_value(a["value"]) for a in s.get("attributes", [])},
                                      tuple(e["name"] for e in s.get("events", []))))
        with self._lock:
            self.spans.extend(spans)


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any) -> Any:  # noqa: N802
        self.collector.exports.append("grpc")
        self.collector.add_protobuf(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real collector: exporters reuse their connection

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path != "/v1/traces":
                self.send_response(404)
            elif "json" in self.headers.get("content-type", ""):
                collector.exports.append("http/json")
                collector.add_json(json.loads(body))
                self.send_response(200)
            else:
                collector.exports.append("http/protobuf")
                collector.add_protobuf(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Handler
