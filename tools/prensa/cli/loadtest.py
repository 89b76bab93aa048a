"""`prensa loadtest`: a bounded, stepped locust run against the local gateway (`step`, what
`prensa loadtest [SCENARIO]` runs), and a soak of a prensa of its own, memory watched (`soak`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from prensa.addresses import GATEWAY_URL, TRITON_METRICS_URL
from prensa.bench.loadtest import SCENARIOS, LoadTestOptions, run_loadtest, write_plot
from prensa.cli.extras import require
from prensa.cli.groups import default_command_group

app = typer.Typer(
    cls=default_command_group("step"),
    help="Load prensa: `prensa loadtest [SCENARIO]` is `prensa loadtest step [SCENARIO]`.",
)


# Its variables keep the names they had as `prensa loadtest`'s (PRENSA_LOADTEST_<FLAG>).
@app.command(context_settings={"auto_envvar_prefix": "PRENSA_LOADTEST"})
def step(
    scenario: Annotated[str, typer.Argument(help=f"One of: {', '.join(SCENARIOS)}.")] = "embed",
    host: Annotated[str, typer.Option(help="Gateway base URL (loopback only).")] = GATEWAY_URL,
    metrics_url: Annotated[
        str, typer.Option(help="Triton metrics endpoint, scraped during the run.")
    ] = TRITON_METRICS_URL,
    out: Annotated[
        Path, typer.Option(help="Folder for locust's CSV/HTML, loadtest.json and loadtest.png.")
    ] = Path("loadtest-results"),
    step_users: Annotated[int, typer.Option(help="Users added per step.")] = 8,
    step_seconds: Annotated[float, typer.Option(help="Seconds per step.")] = 20.0,
    steps: Annotated[
        int, typer.Option(help="Number of steps (the run lasts steps x step-seconds).")
    ] = 4,
    model: Annotated[
        str | None, typer.Option(help="Served model to target; default: the gateway's choice.")
    ] = None,
) -> None:
    """Step load with locust, Triton's metrics scraped alongside; writes CSV, HTML, JSON and PNG."""
    require("bench", "loadtest")
    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"scenario must be one of {', '.join(SCENARIOS)}")
    variable = {"sparse": "PRENSA_SPARSE_MODEL", "rerank": "PRENSA_RERANK_MODEL"}.get(
        scenario, "PRENSA_EMBED_MODEL"
    )
    options = LoadTestOptions(
        scenario=scenario,
        host=host,
        metrics_url=metrics_url,
        out=out,
        step_users=step_users,
        step_seconds=step_seconds,
        steps=steps,
        models={variable: model} if model else None,
    )
    try:
        summary = run_loadtest(options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    (out / "loadtest.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_plot(summary, out / "loadtest.png", f"prensa loadtest: {scenario} against {host}")
    table = Table(
        "users",
        "requests/s",
        "p50 ms",
        "p95 ms",
        "failures/s",
        "encoder avg batch",
        "encoder queue ms",
        title=f"{scenario} step load",
    )
    for step in summary:
        encoder: dict[str, Any] = next(iter(step["encoders"].values()), {})
        table.add_row(
            str(step["users"]),
            f"{step['requests_per_s']:.1f}",
            f"{step['p50_ms']:.0f}",
            f"{step['p95_ms']:.0f}",
            f"{step['failures_per_s']:.2f}",
            f"{encoder.get('average_batch', 0):.1f}",
            f"{encoder.get('queue_ms', 0):.1f}",
        )
    Console().print(table)
    Console().print(f"wrote {out}/locust_*.csv, locust.html, loadtest.json, loadtest.png")


@app.command()
def soak(
    work: Annotated[
        Path, typer.Option(help="Exports (reused), repository, prensa's log and soak-memory.csv.")
    ] = Path("soak-run"),
    model: Annotated[
        list[str] | None,
        typer.Option(help="NAME=SOURCE for `prensa up`; repeatable. Default: its offline set."),
    ] = None,
    minutes: Annotated[
        float, typer.Option(min=0.05, help="Minutes of load after the warm-up.")
    ] = 10.0,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 8,
    sample_every: Annotated[
        float, typer.Option(min=0.1, help="Seconds between memory samples.")
    ] = 3.0,
    max_slope: Annotated[
        float, typer.Option(help="MB/min of steady growth that fails a process.")
    ] = 2.0,
) -> None:
    """A prensa of its own under steady mixed load, every process's memory watched.

    Serves with `prensa up` on free loopback ports, warms up with the largest requests, then sends
    embeddings, sparse embeddings and reranking requests while sampling the RSS of the gateway,
    tritonserver and each stage's stub. Exits 0 when no process grows steadily and no request got a
    5xx or failed to connect, 1 otherwise, 2 when prensa did not start."""
    from prensa.bench.soak import NotServing, SoakRun, run_soak

    require("bench", "loadtest soak")
    console = Console()
    try:
        lines, passed = run_soak(
            SoakRun(work, tuple(model or ()), minutes, concurrency, sample_every, max_slope),
            console.print,
        )
    except NotServing as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    for line in lines:
        console.print(line, highlight=False, markup=False)
    if not passed:
        raise typer.Exit(1)


@app.command()
def heal(
    up_flags: Annotated[
        list[str] | None, typer.Argument(help="More `prensa up` flags, after --.")
    ] = None,
    work: Annotated[
        Path, typer.Option(help="Exports (reused), repository and prensa's log (heal.log).")
    ] = Path("soak-run"),
    model: Annotated[
        list[str] | None,
        typer.Option(help="NAME=SOURCE for `prensa up`; repeatable. Default: its offline set."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 16,
    kills: Annotated[int, typer.Option(min=1, help="Stub kills, one after another.")] = 3,
    gap: Annotated[float, typer.Option(min=1.0, help="Seconds between kills.")] = 20.0,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            help="Request kind the clients send (embeddings, sparse, rerank); repeatable. Default: all the models serve."
        ),
    ] = None,
    honour_retry_after: Annotated[
        bool,
        typer.Option(help="Clients wait as Retry-After says, as the openai SDK and tenacity do."),
    ] = False,
) -> None:
    """How long the embedder answers 503 after its encoder stub is killed, under load.

    Serves with `prensa up` on free loopback ports and kills the Python-backend stub of the
    embedder's encode stage --kills times, --gap seconds apart; per kill, prints how many requests
    failed, when they healed and how long the stage watch took to reload the stage."""
    from prensa.bench.heal import HealRun, run_heal
    from prensa.bench.soak import NotServing

    require("bench", "loadtest heal")
    console = Console()
    run = HealRun(
        work,
        tuple(model or ()),
        concurrency,
        kills,
        gap,
        tuple(kind or ()),
        honour_retry_after,
        tuple(up_flags or ()),
    )
    try:
        lines = run_heal(run, console.print)
    except NotServing as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    for line in lines:
        console.print(line, highlight=False, markup=False)
