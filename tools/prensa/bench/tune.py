"""`prensa tune`: sweep the serving knobs (pipeline included) on this machine, keep the fastest,
write it to the repo.

Each point builds a repository with one setting, starts Triton, drives the bench workload at a
fixed concurrency through the gateway (as HTTP clients call prensa) or Triton's gRPC, and records
throughput and p99. The path matters: the gateway shares the host's cores with the encoder, and
on a small host the layout that serves gRPC clients best is not the one that serves HTTP clients
best. Points run one after another so they never share the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from prensa.addresses import free_port
from prensa.bench.load import LoadResult, Workload, closed_loop
from prensa.bench.suite import BenchOptions, build_workload
from prensa.bench.systems import HttpClient, TritonClient, gateway_server
from prensa.layouts import of_manifest
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.metrics import difference, scrape
from prensa.triton.repo import (
    DEFAULT_ENCODER_INSTANCES,
    ModelSource,
    Pipeline,
    ServingOptions,
    build_repository,
    encoder_model,
)
from prensa.workload import Workloads


@dataclass(frozen=True)
class TunePoint:
    instances: int
    threads: int  # onnxruntime intra-op threads per instance; 0 = all cores
    queue_delay_us: int
    max_batch_tokens: int
    pipeline: str = Pipeline.ENSEMBLE.value  # a plain string: rows stay JSON and print as the value

    @property
    def layout(self) -> Pipeline:
        return Pipeline(self.pipeline)

    def serving(self, base: ServingOptions) -> ServingOptions:
        return replace(
            base,
            encode_instances=self.instances,
            cpu_threads=self.threads,
            queue_delay_us=self.queue_delay_us,
            max_batch_tokens=self.max_batch_tokens,
            pipeline=self.layout,
        )

    @classmethod
    def of(cls, result: dict[str, Any]) -> TunePoint:
        """The point a result row of `measure` was measured at."""
        return cls(**{f.name: result[f.name] for f in fields(cls) if f.name in result})


def default_grid(cpus: int, max_length: int, quick: bool) -> list[TunePoint]:
    """Both pipelines at every instances x threads layout (one instance on every core, or the cores
    split between instances), a few queue delays and token budgets. Quick: one point of each pipeline."""
    layouts = [(DEFAULT_ENCODER_INSTANCES, 0)] + [
        (n, max(cpus // n, 1)) for n in (2, 4) if n <= cpus
    ]
    delays = [0, 2000] if quick else [0, 1000, 5000]
    budgets = sorted({max(max_length, b) for b in ((8192,) if quick else (4096, 16384))})
    points = {
        pipeline: [
            TunePoint(i, t, d, b, pipeline.value)
            for (i, t), d, b in itertools.product(layouts, delays, budgets)
        ]
        for pipeline in Pipeline
    }
    if quick:
        return [each[0] for each in points.values()]
    return [point for each in points.values() for point in each]


def measure(
    point: TunePoint,
    model: ModelSource,
    workload: Workload[Any],
    concurrency: int,
    base: ServingOptions,
    log_dir: Path,
    via_gateway: bool = True,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="prensa-tune-"))
    try:
        build_repository([model], work, point.serving(base))
        ports = TritonPorts(free_port(), free_port(), free_port())
        with (
            TritonProcess(
                TritonOptions(repo=work, ports=ports), log_path=log_dir / "tune-tritonserver.log"
            ) as triton,
            contextlib.ExitStack() as gateway,
        ):
            client: HttpClient | TritonClient
            if via_gateway:
                server = gateway_server(
                    triton.grpc_url, work, free_port(), log_dir / "tune-gateway.log"
                )
                server.start()
                gateway.callback(server.stop)
                client = HttpClient("tune", server.base_url, model.name, "tei")
            else:
                client = TritonClient("tune", triton.grpc_url, model.name)
            send = client.rerank if of_manifest(model.manifest).scores_pairs else client.embed

            async def go() -> LoadResult:
                await client.open()
                try:
                    # warm-up
                    await closed_loop(
                        send,
                        Workload(
                            workload.items[:concurrency],
                            workload.sequences[:concurrency],
                            workload.tokens[:concurrency],
                        ),
                        concurrency,
                    )
                    return await closed_loop(send, workload, concurrency)
                finally:
                    await client.close()

            before = scrape(triton.metrics_url)
            result = asyncio.run(go())
            encoder = difference(scrape(triton.metrics_url), before).get(
                encoder_model(model.name, point.layout)
            )
        figures = result.figures()
        return {
            **asdict(point),
            "seq_per_s": figures["seq_per_s"],
            "p99_ms": figures["p99_ms"],
            "errors": figures["errors"],
            "average_batch": encoder.average_batch if encoder else None,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def best_point(results: list[dict[str, Any]]) -> TunePoint:
    """Highest throughput without errors; p99 breaks ties within 3%."""
    clean = [r for r in results if r["errors"] == 0] or results
    top = max(r["seq_per_s"] for r in clean)
    near = [r for r in clean if r["seq_per_s"] >= 0.97 * top]
    return TunePoint.of(min(near, key=lambda r: r["p99_ms"]))


def tune(
    export_dir: Path,
    name: str,
    requests: int,
    concurrency: int,
    quick: bool,
    log_dir: Path,
    on_result: Callable[[dict[str, Any]], object] = lambda result: None,
    *,
    via_gateway: bool = True,
    workload_kind: Workloads = Workloads.MIXED,
) -> tuple[TunePoint, list[dict[str, Any]]]:
    manifest = Manifest.read(export_dir)
    model = ModelSource(name, export_dir, manifest)
    options = BenchOptions(
        export_dir=export_dir,
        out_dir=log_dir,
        texts=requests,
        rerank_queries=max(requests // 10, 4),
        workload=workload_kind,
    )
    workload = build_workload(manifest, export_dir, options)
    base = ServingOptions()
    results = []
    for point in default_grid(os.cpu_count() or 1, manifest.max_length, quick):
        results.append(measure(point, model, workload, concurrency, base, log_dir, via_gateway))
        on_result(results[-1])
    return best_point(results), results


def write_best(export_dir: Path, name: str, repo: Path, point: TunePoint) -> list[str]:
    """Re-render the model in `repo` with the winning settings (other models there are kept)."""
    return build_repository(
        [ModelSource(name, export_dir, Manifest.read(export_dir))],
        repo,
        point.serving(ServingOptions()),
    )
