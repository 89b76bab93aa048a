"""Triton's own OpenTelemetry tracing, pointed where the gateway sends its spans.

Triton's OpenTelemetry tracing (`--trace-config mode=opentelemetry`) exports OTLP over HTTP only, as JSON, and makes a
request that carries a `traceparent` header part of that trace whatever the header's sampled flag
says. It also samples one request in `rate` on its own, and a request it samples that way may start
a trace of its own although it carries a `traceparent` (seen at rate 1: the gateway's call and
Triton's spans then land in two traces). So Triton's own rate is `NEVER`: it traces exactly the
requests that carry a `traceparent`, which the gateway sends on the calls of the requests it samples;
a `tritonclient` user gets Triton's spans by sending one too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

TRACES_PATH = "/v1/traces"
GRPC_PORT, HTTP_PORT = 4317, 4318  # an OpenTelemetry collector's OTLP ports by convention
# Triton's one-in-N rate for requests without a traceparent: none of them (see above)
NEVER = 2**31 - 1
# The OpenTelemetry SDK's variable for how long spans wait before export; Triton is given it too.
SCHEDULE_DELAY_VARIABLE = "OTEL_BSP_SCHEDULE_DELAY"


class TracingSetupError(ValueError):
    """The gateway's collector endpoint gives no OTLP/HTTP address for Triton."""


@dataclass(frozen=True)
class TritonTracing:
    url: str  # OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces
    service_name: str
    rate: int = NEVER  # one request in `rate` without a traceparent is traced

    def args(self) -> list[str]:
        """tritonserver flags that turn its tracing on."""
        settings = [
            "mode=opentelemetry",
            "level=TIMESTAMPS",
            f"rate={self.rate}",
            "count=-1",
            f"opentelemetry,url={self.url}",
            f"opentelemetry,resource=service.name={self.service_name}",
        ]
        if delay := os.environ.get(SCHEDULE_DELAY_VARIABLE):
            settings.append(f"opentelemetry,bsp_schedule_delay={int(delay)}")
        return [f"--trace-config={setting}" for setting in settings]


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
                "or --otlp-protocol http/protobuf"
            )
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        base = urlunsplit((parts.scheme, f"{host}:{HTTP_PORT}", "", "", ""))
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH
