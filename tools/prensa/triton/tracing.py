"""Triton's own OpenTelemetry tracing, pointed where the gateway sends its spans.

Triton 2.51 (`--trace-config mode=opentelemetry`) exports OTLP over HTTP only, as JSON, and makes a
request that carries a `traceparent` header part of that trace whatever the header's sampled flag
and Triton's own rate say. The gateway sends the header only on the calls of requests it samples,
so those are traced in Triton as well; a request with no header (a `tritonclient` user's) is traced
once in `rate`, which `rate_for` takes from the gateway's sampling rate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

TRACES_PATH = "/v1/traces"
GRPC_PORT, HTTP_PORT = 4317, 4318  # an OpenTelemetry collector's OTLP ports by convention
NEVER = 2**31 - 1  # Triton's rate when only requests carrying a traceparent are to be traced
# The OpenTelemetry SDK's variable for how long spans wait before export; Triton is given it too.
SCHEDULE_DELAY_VARIABLE = "OTEL_BSP_SCHEDULE_DELAY"


class TracingSetupError(ValueError):
    """The gateway's collector endpoint gives no OTLP/HTTP address for Triton."""


@dataclass(frozen=True)
class TritonTracing:
    url: str  # OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces
    service_name: str
    rate: int  # one request in `rate` without a traceparent is traced

    def args(self) -> list[str]:
        """tritonserver flags that turn its tracing on."""
        settings = ["mode=opentelemetry", "level=TIMESTAMPS", f"rate={self.rate}", "count=-1",
                    f"opentelemetry,url={self.url}", f"opentelemetry,resource=service.name={self.service_name}"]
        if delay := os.environ.get(SCHEDULE_DELAY_VARIABLE):
            settings.append(f"opentelemetry,bsp_schedule_delay={int(delay)}")
        return [f"--trace-config={setting}" for setting in settings]


def rate_for(sample_rate: float) -> int:
    """Triton's one-in-N rate for a share of requests."""
    return NEVER if sample_rate <= 0 else max(1, round(1 / sample_rate))


def traces_url(endpoint: str, protocol: str, triton_endpoint: str | None) -> str:
    """Where Triton posts its spans: `triton_endpoint` when given; the gateway's endpoint itself when
    that speaks OTLP/HTTP; else, for a gRPC endpoint on the conventional port 4317, the same host on
    the conventional HTTP port 4318."""
    if triton_endpoint:
        base = triton_endpoint
    elif protocol == "http/protobuf":
        base = endpoint
    else:
        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if parts.port != GRPC_PORT:
            raise TracingSetupError(
                f"Triton sends traces over OTLP/HTTP only, and {endpoint} is a gRPC endpoint off the "
                f"conventional port {GRPC_PORT}: give --triton-otlp-endpoint (the collector's OTLP/HTTP address) "
                "or --otlp-protocol http/protobuf")
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        base = urlunsplit((parts.scheme, f"{host}:{HTTP_PORT}", "", "", ""))
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH
