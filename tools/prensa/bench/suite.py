"""One benchmark run: the same workload through every system, one system up at a time."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Any

from prensa.addresses import free_port, http_url
from prensa.bench.load import Workload, closed_loop
from prensa.bench.systems import (
    EncodeStageAlone,
    HttpClient,
    InProcessResult,
    OnnxLimit,
    SentenceTransformersInProcess,
    TritonClient,
    count_tokens,
    gateway_server,
    infinity_server,
    plain_fastapi_server,
    text_encoder,
)
from prensa.layouts import Layout, of_manifest
from prensa.manifest import Manifest
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.metrics import TOKEN_COUNTERS_LAG_S, difference, scrape
from prensa.triton.repo import (
    ModelSource,
    Pipeline,
    ServingOptions,
    build_repository,
    cache_refusal,
    encoder_model,
)
from prensa.workload import (
    RerankCase,
    Workloads,
    embedding_texts,
    query_texts,
    rerank_cases,
    zipf_queries,
)

SHORT_QUERY = "how are module attributes looked up?"
AGAIN = ", again after the servers"  # the name of the limit measured a second time, at the end
Step = Callable[[str], AbstractContextManager[Any]]


@dataclass
class BenchOptions:
    export_dir: Path
    out_dir: Path
    _: KW_ONLY  # the rest by name
    concurrencies: list[int] = field(default_factory=lambda: [1, 8, 32])
    texts: int = 512
    rerank_queries: int = 32
    passages_per_query: int = 10
    single_repeats: int = 100
    torch_model_dir: Path | None = None
    infinity: str | None = None
    gateway: bool = True
    serving: ServingOptions = field(default_factory=ServingOptions)
    workload: Workloads = Workloads.MIXED
    coalescing: tuple[bool, ...] = (True,)  # gateway runs with --coalesce-requests on, off, or both
    # prensa runs without Triton's response cache, with it, or both
    response_cache: tuple[bool, ...] = (False,)
    # More encoder layouts to measure beside `serving`'s, as (instances, onnxruntime threads per instance).
    layouts: tuple[tuple[int, int], ...] = ()
    pipelines: list[Pipeline] = field(default_factory=lambda: list(Pipeline))


# Triton's response cache in the cached runs: room for every distinct query
BENCH_CACHE_BYTES = 256 << 20


def server_pids(triton: TritonProcess) -> list[int]:
    """tritonserver's pid (its Python stubs are its children), for the CPU it spends per request."""
    return [triton.process.pid] if triton.process is not None else []


def build_workload(manifest: Manifest, export_dir: Path, options: BenchOptions) -> Workload[Any]:
    encoder = text_encoder(export_dir, manifest)
    if of_manifest(manifest).scores_pairs:
        cases = rerank_cases(options.rerank_queries, options.passages_per_query)
        tokens = [count_tokens(encoder, [(c.query, p) for p in c.passages]) for c in cases]
        return Workload(cases, [len(c.passages) for c in cases], tokens)
    texts = {Workloads.QUERIES: query_texts, Workloads.ZIPF: zipf_queries}.get(
        options.workload, embedding_texts
    )(options.texts)
    return Workload(
        [[t] for t in texts], [1] * len(texts), [count_tokens(encoder, [t]) for t in texts]
    )


def _flat(workload: Workload[Any]) -> list[Any]:
    return (
        list(workload.items)
        if isinstance(workload.items[0], RerankCase)
        else [i[0] for i in workload.items]
    )


def _in_process_entry(name: str, result: InProcessResult, single_ms: float) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "in-process",
        "single_query_p50_ms": single_ms,
        "runs": [
            {
                "concurrency": None,
                "seq_per_s": result.sequences / result.seconds,
                "tok_per_s": result.tokens / result.seconds,
            }
        ],
    }


def _reference_entry(
    system: OnnxLimit | EncodeStageAlone,
    workload: Workload[Any],
    short_input: str | tuple[str, str],
    options: BenchOptions,
    suffix: str = "",
) -> dict[str, Any]:
    """An in-process reference measured now: the whole workload, then one short input."""
    return _in_process_entry(
        system.name + suffix,
        system.run(_flat(workload)),
        system.single_latency_ms(short_input, options.single_repeats),
    )


def _drive(
    client: TritonClient | HttpClient,
    workload: Workload[Any],
    kind: Layout,
    options: BenchOptions,
    short: list[str] | RerankCase,
    servers: Sequence[int] = (),
) -> dict[str, Any]:
    send = client.rerank if kind.scores_pairs else client.embed
    single = client.single_latency_ms(short, options.single_repeats)

    async def go() -> dict[str, Any]:
        await client.open()
        try:
            runs = []
            for concurrency in options.concurrencies:
                result = await closed_loop(send, workload, concurrency, servers)
                runs.append(result.figures())
            return {
                "name": client.name,
                "kind": "server",
                "single_query_p50_ms": single,
                "runs": runs,
            }
        finally:
            await client.close()

    return asyncio.run(go())


def layout_label(serving: ServingOptions) -> str:
    """An encoder layout as `--compare-layout` spells it: instances x threads per instance (0: all cores)."""
    return f"{serving.encode_instances}x{serving.cpu_threads}"


def parse_layout(text: str) -> tuple[int, int]:
    """`NxT` (N encoder instances of T onnxruntime threads each, T=0 for every core) as (N, T)."""
    instances, sep, threads = text.lower().partition("x")
    if not sep or not instances.isdigit() or not threads.isdigit() or int(instances) < 1:
        raise ValueError(
            f"an encoder layout is INSTANCESxTHREADS, e.g. 2x1 (threads 0: every core), got {text!r}"
        )
    return int(instances), int(threads)


def _names(
    pipeline: Pipeline, serving: ServingOptions, cached: bool, options: BenchOptions
) -> tuple[str, str]:
    """A prensa variant's label in the report ("prensa fused 2x1 cached") and its name in files
    ("fused-2x1-cached"); the layout is named only when layouts are compared."""
    parts = [*([layout_label(serving)] if options.layouts else []), *(["cached"] if cached else [])]
    label = " ".join(
        ["prensa", *([] if pipeline is Pipeline.ENSEMBLE else [pipeline.value]), *parts]
    )
    return label, "-".join([pipeline.value, *parts])


def run_prensa(
    pipeline: Pipeline,
    manifest: Manifest,
    workload: Workload[Any],
    short_item: list[str] | RerankCase,
    options: BenchOptions,
    work: Path,
    step: Step,
    cached: bool = False,
    serving: ServingOptions | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """prensa through Triton gRPC, then through the gateway, on a repository built with `pipeline`
    (and Triton's response cache, `cached`) on `serving` (default: the options', as
    tools/gpu_check.py runs it); also the encoder's padding, batching and queueing during the gRPC
    runs."""
    name = "bench"
    serving = serving or options.serving
    label, variant = _names(pipeline, serving, cached, options)
    build_repository(
        [ModelSource(name, options.export_dir, manifest)],
        work / "repo",
        replace(serving, pipeline=pipeline, response_cache=cached),
    )
    systems, summary = [], None
    ports = TritonPorts(free_port(), free_port(), free_port())
    with step(f"{label}: starting Triton"):
        triton = TritonProcess(
            TritonOptions(
                repo=work / "repo", ports=ports, cache_bytes=BENCH_CACHE_BYTES if cached else 0
            ),
            log_path=options.out_dir / f"tritonserver-{variant}.log",
        )
        triton.start()
        triton.wait_ready()
    try:
        before = scrape(triton.metrics_url)
        with step(f"{label} via Triton gRPC"):
            systems.append(
                _drive(
                    TritonClient(f"{label} (Triton gRPC)", triton.grpc_url, name),
                    workload,
                    of_manifest(manifest),
                    options,
                    short_item,
                    server_pids(triton),
                )
            )
        time.sleep(TOKEN_COUNTERS_LAG_S)
        encoder = difference(scrape(triton.metrics_url), before).get(encoder_model(name, pipeline))
        if encoder:
            summary = {
                "padded_per_real_token": encoder.padding_ratio,
                "average_batch": encoder.average_batch,
                "queue_ms_per_request": encoder.queue_ms_per_request,
            }
        for coalesce in options.coalescing if options.gateway else ():
            merging = "" if coalesce else ", no coalescing"
            gateway = gateway_server(
                triton.grpc_url,
                work / "repo",
                free_port(),
                options.out_dir / f"gateway-{variant}{'' if coalesce else '-no-coalescing'}.log",
                coalesce=coalesce,
            )
            with step(f"{label} via the gateway{merging} (TEI /embed, /rerank)"):
                gateway.start()
                try:
                    systems.append(
                        _drive(
                            HttpClient(
                                f"{label} (gateway HTTP{merging})", gateway.base_url, name, "tei"
                            ),
                            workload,
                            of_manifest(manifest),
                            options,
                            short_item,
                            [*server_pids(triton), gateway.pid],
                        )
                    )
                finally:
                    gateway.stop()
    finally:
        triton.stop()
    return systems, summary


def run_bench(options: BenchOptions, step: Step) -> dict[str, Any]:
    export_dir = options.export_dir
    manifest = Manifest.read(export_dir)
    kind = of_manifest(manifest)
    if not (kind.dense or kind.scores_pairs):
        raise ValueError(
            f"prensa bench measures embedders and rerankers; this export is {manifest.task.value}"
        )
    workload = build_workload(manifest, export_dir, options)
    short_item: list[str] | RerankCase = (
        RerankCase(
            SHORT_QUERY, ["Module attributes are looked up in the module's namespace dictionary."]
        )
        if kind.scores_pairs
        else [SHORT_QUERY]
    )
    short_input = (
        (short_item.query, short_item.passages[0])
        if isinstance(short_item, RerankCase)
        else SHORT_QUERY
    )
    systems: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "model": manifest.source,
        "task": manifest.task.value,
        "dtype": manifest.dtype,
        "cpus": os.cpu_count(),
        "workload": {
            "kind": options.workload.value,
            "requests": len(workload.items),
            "sequences": sum(workload.sequences),
            "mean_tokens": sum(workload.tokens) / max(sum(workload.sequences), 1),
        },
        "systems": systems,
    }

    # The limit is measured first and again last: `add_ratios` divides by the mean of the two, so a
    # machine that speeds up or slows down during the run shows as their spread, not in the ratios.
    with step("onnxruntime limit (sorted batches of 32, no server)"):
        systems.append(_reference_entry(OnnxLimit(export_dir), workload, short_input, options))
    with step("prensa's encode stage alone (random batches of 32, no server)"):
        systems.append(
            _reference_entry(
                EncodeStageAlone(export_dir, options.serving), workload, short_input, options
            )
        )

    torch_dir = options.torch_model_dir
    if torch_dir:
        with step("sentence-transformers in-process"):
            st = SentenceTransformersInProcess(torch_dir, kind)
            inputs = _flat(workload)
            systems.append(
                _in_process_entry(
                    st.name,
                    st.run(inputs, text_encoder(export_dir, manifest)),
                    st.single_latency_ms(short_input, options.single_repeats),
                )
            )
            del st

    work = Path(tempfile.mkdtemp(prefix="prensa-bench-"))
    try:
        report["prensa_encoder"] = {}
        servings = [
            options.serving,
            *(
                replace(options.serving, encode_instances=instances, cpu_threads=threads)
                for instances, threads in options.layouts
            ),
        ]
        for pipeline, serving, cached in itertools.product(
            options.pipelines, servings, options.response_cache
        ):
            if cached and cache_refusal(manifest.task, pipeline) is not None:
                continue  # Triton's cache cannot key this layout's answers safely (see `cache_refusal`)
            variant = _names(pipeline, serving, cached, options)[1]
            measured, encoder = run_prensa(
                pipeline,
                manifest,
                workload,
                short_item,
                options,
                work / variant,
                step,
                cached,
                serving,
            )
            systems += measured
            if encoder:
                report["prensa_encoder"][variant] = encoder

        if torch_dir:
            port = free_port()
            plain = plain_fastapi_server(
                torch_dir, of_manifest(manifest), port, options.out_dir / "plain_fastapi.log"
            )
            with step("plain FastAPI + sentence-transformers, one encode per request"):
                plain.start()
                try:
                    systems.append(
                        _drive(
                            HttpClient(
                                "FastAPI + sentence-transformers", http_url(port), "", "tei"
                            ),
                            workload,
                            kind,
                            options,
                            short_item,
                            [plain.pid],
                        )
                    )
                finally:
                    plain.stop()
        binary = options.infinity or shutil.which("infinity_emb")
        if binary and torch_dir:
            port = free_port()
            infinity = infinity_server(binary, torch_dir, port, options.out_dir / "infinity.log")
            with step("Infinity (infinity-emb)"):
                infinity.start()
                try:
                    systems.append(
                        _drive(
                            HttpClient("Infinity", http_url(port), str(torch_dir), "openai"),
                            workload,
                            kind,
                            options,
                            short_item,
                            [infinity.pid],
                        )
                    )
                finally:
                    infinity.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with step("onnxruntime limit again, after the servers"):
        systems.append(
            _reference_entry(OnnxLimit(export_dir), workload, short_input, options, AGAIN)
        )
    return report
