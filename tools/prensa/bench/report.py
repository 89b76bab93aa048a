"""Benchmark output: a terminal table, a JSON file and a throughput-vs-p99 plot, with every
figure also given as a ratio to the onnxruntime limit measured in the same run (at its start and
its end, so the machine's drift is stated beside the ratios)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

LIMIT_NAME = "onnxruntime limit"


def limit_figures(report: dict[str, Any]) -> list[float]:
    """Every measurement of the limit in the run, in order (the bench takes one first and one last)."""
    return [
        float(s["runs"][0]["seq_per_s"])
        for s in report["systems"]
        if s["name"].startswith(LIMIT_NAME)
    ]


def add_ratios(report: dict[str, Any]) -> dict[str, Any]:
    figures = limit_figures(report)
    limit = sum(figures) / len(figures)
    report["limit"] = {
        "seq_per_s": limit,
        "measured": figures,
        "spread": (max(figures) - min(figures)) / limit,
    }
    for system in report["systems"]:
        for run in system["runs"]:
            run["vs_limit"] = run["seq_per_s"] / limit if limit else 0.0
    return report


def print_table(report: dict[str, Any], console: Console) -> None:
    title = (
        f"{report['task']} · {report['model']} ({report['dtype']}) · {report['workload']['requests']} requests, "
        f"{report['workload']['mean_tokens']:.0f} tokens/sequence · {report['cpus']} CPUs"
    )
    table = Table(
        "system",
        "clients",
        "seq/s",
        "tok/s",
        "vs limit",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "errors",
        "server CPU ms/req",
        "load gen cores",
        "1 short query p50 ms",
        title=title,
    )
    for system in report["systems"]:
        for index, run in enumerate(system["runs"]):
            latency = [f"{run[k]:.1f}" if k in run else "-" for k in ("p50_ms", "p90_ms", "p99_ms")]
            table.add_row(
                system["name"] if index == 0 else "",
                str(run["concurrency"] or "batched"),
                f"{run['seq_per_s']:.1f}",
                f"{run['tok_per_s']:.0f}",
                f"{run['vs_limit']:.2f}",
                *latency,
                str(run.get("errors", "-")),
                f"{run['server_cpu_ms_per_request']:.2f}"
                if "server_cpu_ms_per_request" in run
                else "-",
                f"{run['client_cpu_cores']:.2f}" if "client_cpu_cores" in run else "-",
                f"{system['single_query_p50_ms']:.1f}" if index == 0 else "",
            )
    console.print(table)
    limit = report["limit"]
    console.print(
        f"ratios are to the mean of the limit's {len(limit['measured'])} measurements, "
        f"{', '.join(f'{x:.1f}' for x in limit['measured'])} seq/s: they moved by "
        f"{limit['spread']:.0%} of it during the run"
    )
    for pipeline, encoder in report.get("prensa_encoder", {}).items():
        console.print(
            f"prensa encoder ({pipeline}): {encoder['padded_per_real_token']:.3f} tokens computed per real "
            f"token, {encoder['average_batch']:.1f} sequences per execute, "
            f"{encoder['queue_ms_per_request']:.1f} ms queued per request"
        )


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def write_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    baseline_styles = itertools.cycle(
        [("black", "--"), ("gray", ":"), ("gray", "-."), ("silver", "--")]
    )
    for system in report["systems"]:
        runs = system["runs"]
        if system["kind"] == "server":
            axis.plot(
                [r["p99_ms"] for r in runs],
                [r["seq_per_s"] for r in runs],
                marker="o",
                label=system["name"],
            )
            for run in runs:
                axis.annotate(
                    str(run["concurrency"]),
                    (run["p99_ms"], run["seq_per_s"]),
                    fontsize=8,
                    textcoords="offset points",
                    xytext=(4, 4),
                )
        else:
            color, style = next(baseline_styles)
            axis.axhline(
                runs[0]["seq_per_s"],
                color=color,
                linestyle=style,
                linewidth=1,
                label=f"{system['name']} (batched)",
            )
    axis.set_xscale("log")
    axis.set_xlabel("p99 latency per request, ms (log); labels = concurrent clients")
    axis.set_ylabel("sequences / s")
    axis.set_title(
        f"{report['task']}: {report['model']} ({report['dtype']}) on {report['cpus']} CPUs",
        fontsize=8,
    )
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
