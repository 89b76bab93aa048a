"""`prensa serve` (Triton on a repository) and `prensa up` (export, build and serve in one go)."""

from __future__ import annotations

import logging
import math
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prensa.addresses import ANY_ADDRESS, LOOPBACK
from prensa.cli.gateway import PANEL, GatewayAddress, with_gateway_options
from prensa.gateway.logs import configure_logging
from prensa.gateway.server import run_server
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.workers import gateway_server
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess, TritonStartError
from prensa.triton.repo import DEFAULT_REPO, Pipeline, cached_models
from prensa.triton.supervisor import RestartPolicy, Supervisor, SupervisorMetrics
from prensa.triton.tracing import TracingSetupError, TritonTracing, traces_url
from prensa.triton.versions import name_problem

console = Console(stderr=True)
log = logging.getLogger("prensa.triton")

# Each option also reads PRENSA_<FLAG>, as the gateway options do (`prensa.cli.gateway.envvar`).
Host = Annotated[
    str,
    typer.Option(
        envvar="PRENSA_HOST",
        help="Address Triton binds; anything but loopback exposes it to the network.",
    ),
]
HttpPort = Annotated[
    int, typer.Option(envvar="PRENSA_HTTP_PORT", help="Triton HTTP/REST (KServe v2) port.")
]
GrpcPort = Annotated[int, typer.Option(envvar="PRENSA_GRPC_PORT", help="Triton gRPC port.")]
MetricsPort = Annotated[
    int, typer.Option(envvar="PRENSA_METRICS_PORT", help="Triton Prometheus metrics port.")
]
LogVerbose = Annotated[
    int, typer.Option(envvar="PRENSA_LOG_VERBOSE", help="Triton --log-verbose level.")
]
ControlMode = Annotated[
    str,
    typer.Option(
        envvar="PRENSA_MODEL_CONTROL_MODE",
        help="Triton --model-control-mode. explicit: every model loaded at start, and a stage whose Python stub dies is reloaded alone; none or poll: such a stage restarts Triton.",
    ),
]
WithGateway = Annotated[
    bool,
    typer.Option(
        "--gateway/--no-gateway",
        envvar="PRENSA_GATEWAY",
        rich_help_panel=PANEL,
        help="Start the OpenAI/TEI HTTP gateway beside Triton.",
    ),
]
RestartLimit = Annotated[
    int,
    typer.Option(
        min=0,
        envvar="PRENSA_RESTART_LIMIT",
        help="Quick Triton failures in a row before giving up (exit 1); 0: never restart.",
    ),
]
RestartBackoff = Annotated[
    float,
    typer.Option(
        min=0.0,
        envvar="PRENSA_RESTART_BACKOFF",
        help="Seconds before restarting a dead Triton, doubled per quick failure (max 30).",
    ),
]
TritonOtlpEndpoint = Annotated[
    str | None,
    typer.Option(
        envvar="PRENSA_TRITON_OTLP_ENDPOINT",
        help="OTLP/HTTP address for Triton's own spans (Triton exports over HTTP only). Default: --otlp-endpoint itself with --otlp-protocol http/protobuf, else the same host on port 4318 when --otlp-endpoint is a gRPC endpoint on 4317.",
    ),
]
CacheSize = Annotated[
    int,
    typer.Option(
        envvar="PRENSA_CACHE_SIZE",
        help="Bytes of memory for Triton's response cache, shared by the models built with `prensa repo build --response-cache` (at least 1 MiB, e.g. 268435456 for 256 MiB); 0: no cache, those models answer every request themselves.",
    ),
]
# The gateway reads tokenizers from Triton's repository, so both default to the same directory.


def say(message: str) -> None:
    """Supervisor news (a death, a restart, a reload, Triton's own errors) on prensa's log."""
    log.warning(message)


def triton_tracing(settings: GatewaySettings, triton_endpoint: str | None) -> TritonTracing | None:
    """Triton's tracing towards the gateway's collector, or None when the gateway does not trace."""
    if not settings.otlp_endpoint:
        return None
    try:
        url = traces_url(settings.otlp_endpoint, settings.otlp_protocol, triton_endpoint)
    except TracingSetupError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--triton-otlp-endpoint'") from exc
    return TritonTracing(url, f"{settings.otlp_service_name}-triton")


def triton_options(**fields: Any) -> TritonOptions:
    """`TritonOptions(**fields)`, a size it refuses reported as the flag's error."""
    try:
        return TritonOptions(**fields)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--cache-size'") from exc


def cache_mismatch(repo: Path, cache_bytes: int) -> str | None:
    """What is wrong between the repository's cached models and the cache size, or None. Triton
    itself says nothing: models with `response_cache` on load without a cache and answer uncached."""
    cached = cached_models(repo)
    if cached and not cache_bytes:
        return (
            f"{', '.join(cached)} turn Triton's response cache on, but --cache-size is 0: Triton answers "
            "every request with the model. Give --cache-size BYTES (PRENSA_CACHE_SIZE) to cache repeats"
        )
    if cache_bytes and not cached:
        return (
            f"--cache-size {cache_bytes} reserves a response cache no model of {repo} uses: "
            "build the repository with `prensa repo build --response-cache`"
        )
    return None


def run_gateway(
    triton: TritonProcess,
    settings: GatewaySettings,
    address: GatewayAddress,
    supervising: threading.Thread,
    supervisor: SupervisorMetrics,
) -> bool:
    """Serve the gateway in this thread, on `settings` pointed at this Triton, until a signal (uvicorn
    re-raises it after draining, which then reaches the handler that stops the supervisor) or until the
    supervisor gives up; False if it never started. It outlives Triton restarts: meanwhile it answers
    503, then carries on."""
    host = triton.options.host if triton.options.host not in ANY_ADDRESS else LOOPBACK
    settings = replace(
        settings, triton_url=f"{host}:{triton.options.ports.grpc}", repo=triton.options.repo
    )
    server = gateway_server(settings, address.host, address.port, [supervisor.registry])

    def stop_with_supervisor() -> None:
        supervising.join()
        server.should_exit = True

    threading.Thread(target=stop_with_supervisor, daemon=True).start()
    return run_server(server)


def run_triton(
    options: TritonOptions,
    gateway: GatewayAddress | None = None,
    policy: RestartPolicy = RestartPolicy(),
    settings: GatewaySettings = GatewaySettings(),
) -> None:
    """Start Triton, wait until every model is ready, print endpoints, keep it running (restarts
    per `policy`), stop cleanly on a signal. A model that fails to load at start exits at once.
    With `gateway`, the gateway (on `settings`, its Triton address and repository replaced) runs beside.
    On a signal the gateway drains first, then Triton; each gets --graceful-timeout."""
    from prensa.gateway.server import raise_descriptor_limit
    from prensa.gateway.workers import share_metrics, worker_count

    configure_logging(settings.log_level, settings.json_output)
    log.info(raise_descriptor_limit().describe())  # before Triton starts: it inherits the limit
    if mismatch := cache_mismatch(options.repo, options.cache_bytes):
        log.warning(mismatch)
    triton = TritonProcess(
        replace(options, exit_timeout_s=max(1, math.ceil(settings.graceful_timeout_s)))
    )
    tracing = f"; traces to {options.tracing.url}" if options.tracing else ""
    log.info(
        "starting tritonserver on %s (its log: %s%s)",
        options.repo,
        triton.log_path,
        tracing,
        extra={"fields": {"repo": str(options.repo), "triton_log": str(triton.log_path)}},
    )
    # the supervisor's counters reach every worker's /metrics
    if gateway and worker_count(settings) > 1:
        share_metrics()
    metrics = SupervisorMetrics()
    supervisor = Supervisor(triton, policy, say, metrics)
    for signum in (signal.SIGTERM, signal.SIGINT):  # both drain Triton; the supervisor then returns
        signal.signal(signum, lambda *_: supervisor.stop())
    try:
        triton.start()
        triton.wait_ready()
    except TritonStartError as exc:
        triton.stop()
        if settings.json_output:
            log.error("%s", exc)
        else:
            console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    endpoints = {
        "HTTP (KServe v2)": f"http://{triton.http_url}",
        "gRPC": triton.grpc_url,
        "metrics": triton.metrics_url,
    }
    if gateway:
        endpoints["gateway (OpenAI + TEI)"] = (
            f"http://{gateway.host}:{gateway.port}  (docs: /docs; "
            f"{worker_count(settings)} worker process(es))"
        )
    if settings.json_output:  # one JSON line, not a table in the middle of them
        log.info("Triton is ready", extra={"fields": {"endpoints": endpoints}})
    else:
        table = Table("endpoint", "address", title="Triton is ready")
        for role, where in endpoints.items():
            table.add_row(role, where)
        console.print(table)
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(supervisor.run()), daemon=True)
    thread.start()
    if gateway and not run_gateway(triton, settings, gateway, thread, metrics):
        supervisor.stop()
        thread.join()
        console.print("[red]error:[/] the gateway did not start (see its log above)")
        raise typer.Exit(1)
    while thread.is_alive():  # a timed join, so signals reach their handler meanwhile
        thread.join(0.5)
    code = outcome[0] if outcome else 1  # none: the supervisor raised, its traceback is above
    if code != 0:
        console.print(f"[red]prensa serve exits with {code}[/]")
        raise typer.Exit(code)


@with_gateway_options()
def serve(
    repo: Annotated[
        Path,
        typer.Option(
            envvar="PRENSA_REPO", help="Triton model repository (from `prensa repo build`)."
        ),
    ] = DEFAULT_REPO,
    host: Host = TritonOptions.host,
    http_port: HttpPort = TritonPorts.http,
    grpc_port: GrpcPort = TritonPorts.grpc,
    metrics_port: MetricsPort = TritonPorts.metrics,
    log_verbose: LogVerbose = TritonOptions.log_verbose,
    model_control_mode: ControlMode = TritonOptions.model_control_mode,
    restart_limit: RestartLimit = RestartPolicy.limit,
    restart_backoff: RestartBackoff = RestartPolicy.backoff_s,
    triton_otlp_endpoint: TritonOtlpEndpoint = None,
    cache_size: CacheSize = TritonOptions.cache_bytes,
    gateway: WithGateway = True,
    *,
    settings: GatewaySettings,
    address: GatewayAddress,
) -> None:
    """Run Triton on REPO (and the HTTP gateway) until Ctrl-C or SIGTERM, restarting Triton if it dies;
    exits non-zero if a model fails to load, or after --restart-limit quick failures in a row."""
    if not repo.is_dir():
        raise typer.BadParameter(f"{repo} is not a directory; run `prensa repo build` first")
    options = triton_options(
        repo=repo,
        host=host,
        ports=TritonPorts(http_port, grpc_port, metrics_port),
        log_verbose=log_verbose,
        model_control_mode=model_control_mode,
        tracing=triton_tracing(settings, triton_otlp_endpoint),
        cache_bytes=cache_size,
    )
    run_triton(
        options,
        address if gateway else None,
        RestartPolicy(limit=restart_limit, backoff_s=restart_backoff),
        settings,
    )


@with_gateway_options()
def up(
    model: Annotated[
        list[str] | None,
        typer.Option(
            envvar="PRENSA_MODEL",
            help="Model to serve: Hub id or local directory, as SOURCE or NAME=SOURCE; repeatable. Default: the offline set (see README).",
        ),
    ] = None,
    models_dir: Annotated[
        Path, typer.Option(envvar="PRENSA_MODELS_DIR", help="Where exports are written and reused.")
    ] = Path("models"),
    repo: Annotated[
        Path, typer.Option(envvar="PRENSA_REPO", help="Model repository to build.")
    ] = DEFAULT_REPO,
    host: Host = TritonOptions.host,
    http_port: HttpPort = TritonPorts.http,
    grpc_port: GrpcPort = TritonPorts.grpc,
    metrics_port: MetricsPort = TritonPorts.metrics,
    pipeline: Annotated[
        Pipeline,
        typer.Option(
            envvar="PRENSA_PIPELINE",
            help="ensemble: tokenize -> encode -> pool models; fused: one model each, two process hops fewer per request (CPU; `prensa bench` compares both).",
        ),
    ] = Pipeline.ENSEMBLE,
    triton_otlp_endpoint: TritonOtlpEndpoint = None,
    cache_size: CacheSize = TritonOptions.cache_bytes,
    gateway: WithGateway = True,
    *,
    settings: GatewaySettings,
    address: GatewayAddress,
) -> None:
    """Export (once), build the repository and serve: the whole path in one command."""
    from prensa.cli.extras import require
    from prensa.defaults import DefaultModel, default_models
    from prensa.export.pipeline import ExportOptions, export_model
    from prensa.manifest import MANIFEST_FILE, Manifest
    from prensa.triton.repo import ModelSource, ServingOptions, build_repository

    options = triton_options(
        repo=repo,
        host=host,
        ports=TritonPorts(http_port, grpc_port, metrics_port),
        tracing=triton_tracing(settings, triton_otlp_endpoint),
        cache_bytes=cache_size,
    )
    chosen = (
        [DefaultModel(*(m.split("=", 1) if "=" in m else (Path(m).name, m))) for m in model]
        if model
        else default_models()
    )
    if not chosen:
        console.print("[red]error:[/] no model given and none of the offline defaults is installed")
        raise typer.Exit(2)
    if problem := next(filter(None, (name_problem(item.name) for item in chosen)), None):
        console.print(f"[red]error:[/] {problem}")
        raise typer.Exit(2)
    sources = []
    for item in chosen:
        out = models_dir / item.name
        if not (out / MANIFEST_FILE).exists():
            require("export", "up")  # only to export: an existing export is served as it is
            console.print(f"exporting {item.source} -> {out}")
            export_model(ExportOptions(source=item.source, out=out, task=item.task))
        sources.append(ModelSource(item.name, out, Manifest.read(out)))
    written = build_repository(
        sources, repo, ServingOptions(pipeline=pipeline, response_cache=cache_size > 0)
    )
    console.print(f"repository {repo}: {', '.join(written)}")
    run_triton(options, address if gateway else None, settings=settings)
