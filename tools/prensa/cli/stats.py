"""`prensa stats`: what Triton has done so far, per model, from its metrics port."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from prensa.addresses import TRITON_METRICS_URL
from prensa.triton.metrics import scrape


def stats(
    metrics_url: Annotated[
        str, typer.Option(help="Triton's Prometheus endpoint.")
    ] = TRITON_METRICS_URL,
) -> None:
    """Per model: requests, failures, average batch size, queue and compute time per request, padding,
    and response-cache hits of those looked up (models built with `prensa repo build --response-cache`)."""
    console = Console()
    try:
        models = scrape(metrics_url)
    except OSError as exc:
        console.print(f"[red]error:[/] cannot read {metrics_url}: {exc}")
        raise typer.Exit(1) from exc
    table = Table(
        "model",
        "requests",
        "failures",
        "avg batch",
        "queue ms/req",
        "compute ms/req",
        "padded/real tokens",
        "cache hits",
        title=f"Triton at {metrics_url}",
    )
    for name in sorted(models):
        m = models[name]
        ratio = f"{m.padding_ratio:.2f}" if m.padding_ratio is not None else "-"
        hits = (
            f"{m.cache_hits:.0f}/{m.cache_lookups:.0f} ({m.cache_hit_ratio:.0%})"
            if m.cache_hit_ratio is not None
            else "-"
        )
        table.add_row(
            name,
            f"{m.success:.0f}",
            f"{m.failure:.0f}",
            f"{m.average_batch:.1f}",
            f"{m.queue_ms_per_request:.2f}",
            f"{m.compute_ms_per_request:.2f}",
            ratio,
            hits,
        )
    console.print(table)
