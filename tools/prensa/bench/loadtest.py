"""`prensa loadtest`: locust headless with a step load against the local gateway, while Triton's
metrics are scraped, then one picture of what each step of users got."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from prensa.addresses import LOOPBACK_NAMES
from prensa.stages import stage_of_model
from prensa.triton.metrics import ModelStats, difference, scrape

# locust runs it by path, in its own process
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
SCENARIOS = {
    "openai": "OpenAIEmbeddingsUser",
    "embed": "TEIEmbedUser",
    "sparse": "TEISparseUser",
    "rerank": "TEIRerankUser",
}


@dataclass(frozen=True, kw_only=True)
class LoadTestOptions:
    scenario: str
    host: str
    metrics_url: str
    out: Path
    step_users: int = 8
    step_seconds: float = 20.0
    steps: int = 4
    models: dict[str, str] | None = None  # PRENSA_*_MODEL environment for the locustfile


def require_loopback(url: str) -> None:
    """Load is only ever sent to this machine."""
    if urlparse(url).hostname not in LOOPBACK_NAMES:
        raise ValueError(
            f"{url} is not a loopback address; prensa loadtest only targets this machine"
        )


class MetricsSampler(threading.Thread):
    """Scrapes Triton every `interval` seconds; samples are (seconds since start, stats)."""

    def __init__(self, url: str, interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, dict[str, ModelStats]]] = []
        self.stopped = threading.Event()
        self.started_at = time.monotonic()

    def run(self) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic() - self.started_at, scrape(self.url)))
            self.stopped.wait(self.interval)


def per_step(
    options: LoadTestOptions, history: Path, samples: list[tuple[float, dict[str, ModelStats]]]
) -> list[dict[str, Any]]:
    """Aggregate locust's history rows and the Triton scrapes by step (user count)."""
    rows = [
        r
        for r in csv.DictReader(history.open())
        if r["Name"] == "Aggregated" and r["User Count"] != "0"
    ]
    steps: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        steps.setdefault(int(row["User Count"]), []).append(row)
    summary = []
    for index, (users, group) in enumerate(sorted(steps.items())):

        def mean(column: str) -> float:
            values = [float(r[column]) for r in group if r[column] not in ("", "N/A")]  # noqa: B023 - called in this iteration
            return sum(values) / len(values) if values else 0.0

        start, end = index * options.step_seconds, (index + 1) * options.step_seconds
        window = [s for t, s in samples if start <= t <= end]
        encoders = {}
        if len(window) >= 2:
            delta = difference(window[-1], window[0])
            encoders = {
                name: {"average_batch": s.average_batch, "queue_ms": s.queue_ms_per_request}
                for name, s in delta.items()
                if (stage_of_model(name) == "encode" or s.real_tokens) and s.success
            }
        summary.append(
            {
                "users": users,
                "requests_per_s": mean("Requests/s"),
                "p50_ms": mean("50%"),
                "p95_ms": mean("95%"),
                "failures_per_s": mean("Failures/s"),
                "encoders": encoders,
            }
        )
    return summary


def run_loadtest(options: LoadTestOptions) -> list[dict[str, Any]]:
    require_loopback(options.host)
    require_loopback(options.metrics_url)
    options.out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PRENSA_STEP_USERS": str(options.step_users),
        "PRENSA_STEP_SECONDS": str(options.step_seconds),
        "PRENSA_STEPS": str(options.steps),
        **(options.models or {}),
    }
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-H",
        options.host,
        "--csv",
        str(options.out / "locust"),
        "--csv-full-history",
        "--html",
        str(options.out / "locust.html"),
        "--only-summary",
        SCENARIOS[options.scenario],
    ]
    sampler = MetricsSampler(options.metrics_url)
    sampler.start()
    try:
        limit = options.step_seconds * options.steps + 60
        subprocess.run(
            command,
            env=env,
            timeout=limit,
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=(options.out / "locust.log").open("wb"),
        )
    finally:
        sampler.stopped.set()
        sampler.join()
    return per_step(options, options.out / "locust_stats_history.csv", sampler.samples)


def write_plot(summary: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users = [s["users"] for s in summary]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(
        users,
        [s["requests_per_s"] for s in summary],
        marker="o",
        color="tab:blue",
        label="requests/s",
    )
    top.set_ylabel("requests / s")
    latency = top.twinx()
    latency.plot(users, [s["p50_ms"] for s in summary], marker="s", color="tab:green", label="p50")
    latency.plot(users, [s["p95_ms"] for s in summary], marker="^", color="tab:red", label="p95")
    latency.set_ylabel("latency, ms")
    top.legend(loc="upper left", fontsize=8)
    latency.legend(loc="lower right", fontsize=8)
    top.set_title(title)
    encoders = sorted({name for s in summary for name in s["encoders"]})
    for name in encoders:
        bottom.plot(
            users,
            [s["encoders"].get(name, {}).get("average_batch", 0) for s in summary],
            marker="o",
            label=f"{name} avg batch",
        )
    queue = bottom.twinx()
    for name in encoders:
        queue.plot(
            users,
            [s["encoders"].get(name, {}).get("queue_ms", 0) for s in summary],
            linestyle="--",
            label=f"{name} queue ms",
        )
    bottom.set_xlabel("concurrent users")
    bottom.set_ylabel("sequences per execute")
    queue.set_ylabel("queue ms / request")
    bottom.legend(loc="upper left", fontsize=8)
    queue.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
