"""Where Triton's spans go and what it samples (prensa.triton.tracing), the flags that turn its
tracing on, and a gateway that does not trace never loading the OpenTelemetry SDK. Triton accepting
those flags and its spans joining the gateway's trace: tests/e2e/test_tracing.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prensa.gateway.settings import GatewaySettings, InvalidSetting
from prensa.triton.launcher import TritonOptions, triton_command
from prensa.triton.tracing import NEVER, TracingSetupError, TritonTracing, traces_url


@pytest.mark.parametrize(("endpoint", "protocol", "triton", "expected"), [
    ("http://collector:4317", "grpc", None, "http://collector:4318/v1/traces"),
    ("collector:4317", "grpc", None, "http://collector:4318/v1/traces"),
    ("https://[::1]:4317/", "grpc", None, "https://[::1]:4318/v1/traces"),
    ("http://collector:4318", "http/protobuf", None, "http://collector:4318/v1/traces"),
    ("http://collector:4318/v1/traces", "http/protobuf", None, "http://collector:4318/v1/traces"),
    ("http://collector:9999", "grpc", "http://other:55681/", "http://other:55681/v1/traces"),
])
def test_triton_posts_to_the_collectors_http_address(endpoint, protocol, triton, expected):
    assert traces_url(endpoint, protocol, triton) == expected


def test_a_grpc_endpoint_off_the_usual_port_needs_tritons_own():
    with pytest.raises(TracingSetupError, match="--triton-otlp-endpoint"):
        traces_url("http://collector:9999", "grpc", None)


def test_triton_traces_only_requests_that_carry_a_traceparent():
    """Triton's own sampling can start a second trace for a request that carries one (see the module)."""
    assert TritonTracing("http://c:4318/v1/traces", "prensa-triton").rate == NEVER
    assert f"--trace-config=rate={NEVER}" in TritonTracing("http://c:4318/v1/traces", "prensa-triton").args()


def test_tracing_flags_reach_tritonserver_only_when_asked(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    assert not any(a.startswith("--trace") for a in triton_command(TritonOptions(tmp_path)))
    tracing = TritonTracing("http://c:4318/v1/traces", "prensa-triton", 10)
    args = triton_command(TritonOptions(tmp_path, tracing=tracing))
    assert {"--trace-config=mode=opentelemetry", "--trace-config=rate=10", "--trace-config=level=TIMESTAMPS",
            "--trace-config=opentelemetry,url=http://c:4318/v1/traces",
            "--trace-config=opentelemetry,resource=service.name=prensa-triton"} <= set(args)
    assert not any("bsp_schedule_delay" in a for a in args)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    assert "--trace-config=opentelemetry,bsp_schedule_delay=250" in tracing.args()


@pytest.mark.parametrize(("change", "field"), [({"otlp_protocol": "zipkin"}, "otlp_protocol"),
                                               ({"otlp_sample_rate": 1.5}, "otlp_sample_rate"),
                                               ({"otlp_sample_rate": -0.1}, "otlp_sample_rate")])
def test_bad_tracing_settings_are_refused(change, field):
    with pytest.raises(InvalidSetting) as refused:
        GatewaySettings(**change)
    assert refused.value.name == field


def test_a_gateway_without_endpoint_never_loads_the_sdk():
    script = ("import sys\nfrom prensa.gateway.app import create_app\nfrom prensa.gateway.settings import GatewaySettings\n"
              "app = create_app(GatewaySettings())\napp.build_middleware_stack()\n"
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip() == "[]"
