"""`prensa bench`: prensa side by side with the onnxruntime limit and its peers, in one run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prensa.bench.report import add_ratios, print_table, write_json, write_plot
from prensa.bench.suite import BenchOptions, parse_layout, run_bench
from prensa.cli.extras import require
from prensa.cli.interrupt import sigterm_exits
from prensa.cli.options import with_options
from prensa.cli.progress import step_progress
from prensa.manifest import Manifest
from prensa.triton.repo import Pipeline, ServingOptions
from prensa.workload import Workloads


def layout_option(text: str) -> tuple[int, int]:
    try:
        return parse_layout(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--compare-layout") from None


@with_options(ServingOptions, "serving", only=("encode_instances", "cpu_threads", "queue_delay_us", "max_batch_tokens"))
def bench(
    export_dir: Annotated[Path, typer.Argument(help="An export from `prensa export` (embedder or reranker).")],
    out: Annotated[Path, typer.Option(help="Folder for bench.json, bench.png and server logs.")] = Path("bench-results"),
    torch_model: Annotated[Path | None, typer.Option(help="sentence-transformers model dir for the peers; default: the export's source when it is a local directory with weights.")] = None,
    concurrency: Annotated[list[int] | None, typer.Option(help="Concurrent clients per run; repeatable.")] = None,
    texts: Annotated[int, typer.Option(help="Embedding requests (one text each) in the workload.")] = 512,
    queries: Annotated[int, typer.Option(help="Rerank requests in the workload.")] = 32,
    passages: Annotated[int, typer.Option(help="Passages per rerank request.")] = 10,
    infinity: Annotated[str | None, typer.Option(help="Path of an `infinity_emb` binary (its own venv); default: on PATH.")] = None,
    gateway: Annotated[bool, typer.Option(help="Also measure prensa through its HTTP gateway.")] = True,
    quick: Annotated[bool, typer.Option(help="Tiny run for CI: 24 requests, clients 1 and 4, 5 repeats.")] = False,
    pipeline: Annotated[list[Pipeline] | None, typer.Option(help="prensa repository layout(s) to measure; repeatable. Default: ensemble and fused.")] = None,
    workload: Annotated[Workloads, typer.Option(help="Embedders: mixed (30% short queries, 70% passages), queries (short queries only, the online path) or zipf (short queries repeated by a Zipf law, s=1.1 over 10,000).")] = Workloads.MIXED,
    peers: Annotated[bool, typer.Option(help="Also measure the torch peers (sentence-transformers in-process, a plain FastAPI server, Infinity when installed).")] = True,
    compare_cache: Annotated[bool, typer.Option(help="Measure prensa without and with Triton's response cache (embedders and SPLADE, ensemble pipeline); with --workload zipf, repeated queries as search traffic repeats them.")] = False,
    compare_coalescing: Annotated[bool, typer.Option(help="Measure the gateway twice: merging concurrent requests into one Triton call (the default) and not.")] = False,
    compare_layout: Annotated[list[str] | None, typer.Option(metavar="INSTANCESxTHREADS", help="Also measure prensa with this encoder layout (e.g. 2x1: two instances of one onnxruntime thread each; threads 0 = every core) beside --instances/--cpu-threads; repeatable.")] = None,
    *,
    serving: ServingOptions,
) -> None:
    """Measure sequences/s, tokens/s, p50/p90/p99 and single-query latency for every system."""
    require("bench", "bench")
    console = Console(width=None if sys.stdout.isatty() else 160)  # logs and CI get the whole table
    manifest = Manifest.read(export_dir)
    source = Path(manifest.source)
    torch_dir = torch_model or (source if (source / "config.json").exists() and any(source.glob("*.safetensors")) else None)
    torch_dir = torch_dir if peers else None
    options = BenchOptions(
        export_dir=export_dir, out_dir=out, concurrencies=concurrency or ([1, 4] if quick else [1, 8, 32]),
        texts=24 if quick else texts, rerank_queries=4 if quick else queries,
        passages_per_query=4 if quick else passages, single_repeats=5 if quick else 100, torch_model_dir=torch_dir,
        infinity=infinity, gateway=gateway,
        serving=serving,
        pipelines=pipeline or list(Pipeline), workload=workload,
        coalescing=(True, False) if compare_coalescing else (True,),
        response_cache=(False, True) if compare_cache else (False,),
        layouts=tuple(layout_option(text) for text in compare_layout or ()),
    )
    out.mkdir(parents=True, exist_ok=True)
    with sigterm_exits(), step_progress(console) as step:
        report = add_ratios(run_bench(options, step))
    print_table(report, console)
    write_json(report, out / "bench.json")
    write_plot(report, out / "bench.png")
    console.print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
