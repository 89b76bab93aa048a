"""`prensa tune`: find this machine's best pipeline, encoder layout, queue delay and token budget."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from prensa.bench.tune import TunePoint, write_best
from prensa.bench.tune import tune as run_tune
from prensa.cli.interrupt import sigterm_exits
from prensa.triton.repo import DEFAULT_REPO
from prensa.workload import Workloads


def tune(
    export_dir: Annotated[Path, typer.Argument(help="An export from `prensa export`.")],
    name: Annotated[str, typer.Option(help="Model name in the repository.")],
    repo: Annotated[
        Path, typer.Option(help="Repository to write the winning settings into.")
    ] = DEFAULT_REPO,
    requests: Annotated[int, typer.Option(help="Requests per sweep point.")] = 192,
    concurrency: Annotated[int, typer.Option(help="Concurrent clients per sweep point.")] = 32,
    quick: Annotated[bool, typer.Option(help="Two points only (CI).")] = False,
    write: Annotated[bool, typer.Option(help="Write the best settings into REPO.")] = True,
    gateway: Annotated[
        bool,
        typer.Option(
            help="Measure each point through the HTTP gateway, as HTTP clients call prensa (it shares the cores with the encoder); --no-gateway: Triton's gRPC, for tritonclient users."
        ),
    ] = True,
    workload: Annotated[
        Workloads,
        typer.Option(
            help="Embedders: mixed (30% short queries, 70% passages), queries (short queries only) or zipf, as `prensa bench --workload`."
        ),
    ] = Workloads.MIXED,
) -> None:
    """Sweep the pipeline, encoder instances x threads, queue delay and max batch tokens; keep the fastest."""
    console = Console()
    table = Table(
        "pipeline",
        "instances",
        "threads",
        "queue delay us",
        "max batch tokens",
        "seq/s",
        "p99 ms",
        "avg batch",
        "errors",
        title=f"tuning {name} at {concurrency} concurrent clients "
        f"({'gateway HTTP' if gateway else 'Triton gRPC'}, {workload.value})",
    )

    def show(result: dict[str, Any]) -> None:
        console.print(
            f"  {result['pipeline']}, {result['instances']} x {result['threads'] or 'all'} threads, delay "
            f"{result['queue_delay_us']} us, budget {result['max_batch_tokens']}: "
            f"{result['seq_per_s']:.1f} seq/s, p99 {result['p99_ms']:.0f} ms"
        )

    with sigterm_exits():
        best, results = run_tune(
            export_dir,
            name,
            requests,
            concurrency,
            quick,
            repo.parent / ".prensa",
            show,
            via_gateway=gateway,
            workload_kind=workload,
        )
    for r in results:
        mark = "[green]" if TunePoint.of(r) == best else ""
        table.add_row(
            *(
                f"{mark}{v}"
                for v in (
                    r["pipeline"],
                    r["instances"],
                    r["threads"] or "all",
                    r["queue_delay_us"],
                    r["max_batch_tokens"],
                    f"{r['seq_per_s']:.1f}",
                    f"{r['p99_ms']:.0f}",
                    f"{r['average_batch'] or 0:.1f}",
                    r["errors"],
                )
            )
        )
    console.print(table)
    if write:
        written = write_best(export_dir, name, repo, best)
        console.print(f"wrote {', '.join(written)} to {repo} with {best}")
