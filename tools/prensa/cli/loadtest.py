"""`prensa loadtest`: a bounded, stepped locust run against the local gateway."""

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


def loadtest(
    scenario: Annotated[str, typer.Argument(help=f"One of: {', '.join(SCENARIOS)}.")] = "embed",
    host: Annotated[str, typer.Option(help="Gateway base URL (loopback only).")] = GATEWAY_URL,
    metrics_url: Annotated[str, typer.Option(help="Triton metrics endpoint, scraped during the run.")] = TRITON_METRICS_URL,
    out: Annotated[Path, typer.Option(help="Folder for locust's CSV/HTML, loadtest.json and loadtest.png.")] = Path("loadtest-results"),
    step_users: Annotated[int, typer.Option(help="Users added per step.")] = 8,
    step_seconds: Annotated[float, typer.Option(help="Seconds per step.")] = 20.0,
    steps: Annotated[int, typer.Option(help="Number of steps (the run lasts steps x step-seconds).")] = 4,
    model: Annotated[str | None, typer.Option(help="Served model to target; default: the gateway's choice.")] = None,
) -> None:
    """Step load with locust, Triton's metrics scraped alongside; writes CSV, HTML, JSON and PNG."""
    require("bench", "loadtest")
    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"scenario must be one of {', '.join(SCENARIOS)}")
    variable = {"sparse": "PRENSA_SPARSE_MODEL", "rerank": "PRENSA_RERANK_MODEL"}.get(scenario, "PRENSA_EMBED_MODEL")
    options = LoadTestOptions(scenario=scenario, host=host, metrics_url=metrics_url, out=out, step_users=step_users,
                              step_seconds=step_seconds, steps=steps, models={variable: model} if model else None)
    try:
        summary = run_loadtest(options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    (out / "loadtest.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_plot(summary, out / "loadtest.png", f"prensa loadtest: {scenario} against {host}")
    table = Table("users", "requests/s", "p50 ms", "p95 ms", "failures/s", "encoder avg batch", "encoder queue ms",
                  title=f"{scenario} step load")
    for step in summary:
        encoder: dict[str, Any] = next(iter(step["encoders"].values()), {})
        table.add_row(str(step["users"]), f"{step['requests_per_s']:.1f}", f"{step['p50_ms']:.0f}",
                      f"{step['p95_ms']:.0f}", f"{step['failures_per_s']:.2f}",
                      f"{encoder.get('average_batch', 0):.1f}", f"{encoder.get('queue_ms', 0):.1f}")
    Console().print(table)
    Console().print(f"wrote {out}/locust_*.csv, locust.html, loadtest.json, loadtest.png")
