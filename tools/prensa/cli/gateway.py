"""`prensa gateway`: the OpenAI- and TEI-compatible HTTP API in front of a running Triton."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer
import uvicorn

from prensa.gateway.settings import GatewaySettings

GatewayHost = Annotated[str, typer.Option("--gateway-host", help="Address the gateway binds.")]
GatewayPort = Annotated[int, typer.Option("--gateway-port", help="Gateway HTTP port.")]


def gateway_server(settings: GatewaySettings, host: str, port: int) -> uvicorn.Server:
    """A uvicorn server for the gateway; `run()` blocks, `should_exit = True` stops it."""
    from prensa.gateway.app import create_app

    return uvicorn.Server(uvicorn.Config(create_app(settings), host=host, port=port, log_level="warning",
                                         access_log=False, timeout_keep_alive=settings.keep_alive_s))


def run_server(server: uvicorn.Server) -> bool:
    """Serve until stopped; False when it never started (uvicorn exits on a failed start-up)."""
    try:
        server.run()
    except SystemExit:
        return False
    return server.started


def gateway(
    triton_url: Annotated[str, typer.Option(help="Triton gRPC address; several replicas as a comma-separated list (least outstanding requests, health-checked).")] = GatewaySettings.triton_url,
    repo: Annotated[Path, typer.Option(help="Triton's model repository, read for tokenizer files.")] = GatewaySettings.repo,
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback exposes the API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 8080,
    default_model: Annotated[Optional[str], typer.Option(help="Model for requests naming none (if it fits the route).")] = GatewaySettings.default_model,
    max_concurrent_requests: Annotated[int, typer.Option(help="Inputs in flight before requests get 429.")] = GatewaySettings.max_concurrent_requests,
    max_client_batch_size: Annotated[int, typer.Option(help="Inputs per request before 422.")] = GatewaySettings.max_client_batch_size,
    split_large_batches: Annotated[bool, typer.Option(help="Split larger requests into Triton calls instead of 422.")] = GatewaySettings.split_large_batches,
    payload_limit: Annotated[int, typer.Option(help="Max request body in bytes (413 above).")] = GatewaySettings.payload_limit,
    auto_truncate: Annotated[bool, typer.Option(help="Truncate too long inputs when a request does not say.")] = GatewaySettings.auto_truncate,
    api_key: Annotated[Optional[str], typer.Option(envvar="PRENSA_API_KEY",
                                                   help="Require `Authorization: Bearer KEY` on inference routes.")] = None,
    cors_allow_origin: Annotated[Optional[list[str]], typer.Option(help="Allowed CORS origin; repeatable.")] = None,
    triton_timeout: Annotated[float, typer.Option(help="Seconds a Triton inference call may take before 503.")] = GatewaySettings.triton_timeout_s,
    keep_alive: Annotated[float, typer.Option(help="Seconds an idle client connection stays open; keep it above "
                                                   "your clients' and proxies' idle timeouts.")] = GatewaySettings.keep_alive_s,
) -> None:
    """Serve OpenAI /v1/embeddings and TEI's API (embed, rerank, predict, ...) over Triton gRPC."""
    settings = GatewaySettings(
        triton_url=triton_url, repo=repo, default_model=default_model, max_concurrent_requests=max_concurrent_requests,
        max_client_batch_size=max_client_batch_size, split_large_batches=split_large_batches,
        payload_limit=payload_limit, auto_truncate=auto_truncate, api_key=api_key,
        cors_allow_origins=tuple(cors_allow_origin or ()), triton_timeout_s=triton_timeout,
        keep_alive_s=keep_alive,
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    typer.echo(f"prensa gateway on http://{host}:{port} (Triton {triton_url}); docs at /docs", err=True)
    if not run_server(gateway_server(settings, host, port)):
        raise typer.Exit(1)  # uvicorn logged why (an unserved --default-model, a taken port, ...)
