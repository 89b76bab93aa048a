"""`prensa bench`: prensa side by side with the onnxruntime limit and its peers, in one run
(`compare`, what `prensa bench EXPORT` runs), and the measures of one part of it: the gateway's own
CPU (`gateway`), what tracing costs (`tracing`), what Triton's response cache buys (`cache`), what
per-token outputs cost against pooled ones (`late`)."""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from prensa.bench.cache_gain import CACHE_BYTES
from prensa.bench.report import add_ratios, print_table, write_json, write_plot
from prensa.bench.suite import BenchOptions, parse_layout, run_bench
from prensa.cli.extras import require
from prensa.cli.groups import default_command_group
from prensa.cli.interrupt import sigterm_exits
from prensa.cli.options import with_options
from prensa.cli.progress import step_progress
from prensa.layouts import EMBEDDER, of_manifest
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, build_repository
from prensa.workload import Workloads

DEFAULT_COMMAND = "compare"
# the model name of the repository `gateway` and `tracing` build from an export
BENCH_MODEL = "bench"


app = typer.Typer(
    cls=default_command_group(DEFAULT_COMMAND),
    no_args_is_help=True,
    help="Measure prensa: `prensa bench EXPORT` is `prensa bench compare EXPORT`.",
)


def layout_option(text: str) -> tuple[int, int]:
    try:
        return parse_layout(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--compare-layout") from None


# Its variables keep the names they had as `prensa bench`'s (PRENSA_BENCH_<FLAG>).
@app.command(context_settings={"auto_envvar_prefix": "PRENSA_BENCH"})
@with_options(
    ServingOptions,
    "serving",
    only=("encode_instances", "cpu_threads", "queue_delay_us", "max_batch_tokens"),
)
def compare(
    export_dir: Annotated[
        Path, typer.Argument(help="An export from `prensa export` (embedder or reranker).")
    ],
    out: Annotated[
        Path, typer.Option(help="Folder for bench.json, bench.png and server logs.")
    ] = Path("bench-results"),
    torch_model: Annotated[
        Path | None,
        typer.Option(
            help="sentence-transformers model dir for the peers; default: the export's source when it is a local directory with weights."
        ),
    ] = None,
    concurrency: Annotated[
        list[int] | None, typer.Option(help="Concurrent clients per run; repeatable.")
    ] = None,
    texts: Annotated[
        int, typer.Option(help="Embedding requests (one text each) in the workload.")
    ] = 512,
    queries: Annotated[int, typer.Option(help="Rerank requests in the workload.")] = 32,
    passages: Annotated[int, typer.Option(help="Passages per rerank request.")] = 10,
    infinity: Annotated[
        str | None,
        typer.Option(help="Path of an `infinity_emb` binary (its own venv); default: on PATH."),
    ] = None,
    gateway: Annotated[
        bool, typer.Option(help="Also measure prensa through its HTTP gateway.")
    ] = True,
    quick: Annotated[
        bool, typer.Option(help="Tiny run for CI: 24 requests, clients 1 and 4, 5 repeats.")
    ] = False,
    pipeline: Annotated[
        list[Pipeline] | None,
        typer.Option(
            help="prensa repository layout(s) to measure; repeatable. Default: ensemble and fused."
        ),
    ] = None,
    workload: Annotated[
        Workloads,
        typer.Option(
            help="Embedders: mixed (30% short queries, 70% passages), queries (short queries only, the online path) or zipf (short queries repeated by a Zipf law, s=1.1 over 10,000)."
        ),
    ] = Workloads.MIXED,
    peers: Annotated[
        bool,
        typer.Option(
            help="Also measure the torch peers (sentence-transformers in-process, a plain FastAPI server, Infinity when installed)."
        ),
    ] = True,
    compare_cache: Annotated[
        bool,
        typer.Option(
            help="Measure prensa without and with Triton's response cache (embedders and SPLADE, ensemble pipeline); with --workload zipf, repeated queries as search traffic repeats them."
        ),
    ] = False,
    compare_coalescing: Annotated[
        bool,
        typer.Option(
            help="Measure the gateway twice: merging concurrent requests into one Triton call (the default) and not."
        ),
    ] = False,
    compare_layout: Annotated[
        list[str] | None,
        typer.Option(
            metavar="INSTANCESxTHREADS",
            help="Also measure prensa with this encoder layout (e.g. 2x1: two instances of one onnxruntime thread each; threads 0 = every core) beside --instances/--cpu-threads; repeatable.",
        ),
    ] = None,
    *,
    serving: ServingOptions,
) -> None:
    """Measure sequences/s, tokens/s, p50/p90/p99 and single-query latency for every system."""
    require("bench", "bench")
    console = Console(width=None if sys.stdout.isatty() else 160)  # logs and CI get the whole table
    try:
        manifest = Manifest.read(export_dir)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="EXPORT_DIR") from exc
    source = Path(manifest.source)
    # a transformers or sentence-transformers directory (a static model has no config.json)
    loadable = (source / "config.json").exists() or (source / "modules.json").exists()
    torch_dir = torch_model or (source if loadable and any(source.rglob("*.safetensors")) else None)
    torch_dir = torch_dir if peers else None
    options = BenchOptions(
        export_dir=export_dir,
        out_dir=out,
        concurrencies=concurrency or ([1, 4] if quick else [1, 8, 32]),
        texts=24 if quick else texts,
        rerank_queries=4 if quick else queries,
        passages_per_query=4 if quick else passages,
        single_repeats=5 if quick else 100,
        torch_model_dir=torch_dir,
        infinity=infinity,
        gateway=gateway,
        serving=serving,
        pipelines=pipeline or list(Pipeline),
        workload=workload,
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


@contextmanager
def embedder_repository(export_dir: Path) -> Iterator[Path]:
    """A repository of the export alone (as `bench`), in a folder removed afterwards."""
    try:
        manifest = Manifest.read(export_dir)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="EXPORT_DIR") from exc
    if (
        of_manifest(manifest) is not EMBEDDER
    ):  # a pooled embedder alone answers /embed and nothing else
        raise typer.BadParameter(
            f"measures /embed: needs an embedding export, {export_dir} is {manifest.task.value}",
            param_hint="EXPORT_DIR",
        )
    with tempfile.TemporaryDirectory(prefix="prensa-bench-") as scratch:
        repo = Path(scratch) / "repo"
        build_repository([ModelSource(BENCH_MODEL, export_dir, manifest)], repo, ServingOptions())
        yield repo


ExportDir = Annotated[Path, typer.Argument(help="An embedding export from `prensa export`.")]


@app.command()
def gateway(
    export_dir: ExportDir,
    requests: Annotated[
        int, typer.Option(min=1, help="Requests per round (5 rounds); with --http, one run.")
    ] = 2000,
    http: Annotated[
        bool,
        typer.Option(
            help="Through the gateway's real HTTP server in a child process, over "
            "loopback, instead of its app in this process."
        ),
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="With --http: concurrent clients.")] = 64,
    workers: Annotated[int, typer.Option(min=1, help="With --http: gateway worker processes.")] = 1,
    grpc: Annotated[
        bool,
        typer.Option(
            help="With --http: TEI's gRPC Embed on the same server (--tei-grpc-port) instead of "
            "HTTP /embed."
        ),
    ] = False,
    log: Annotated[
        Path | None,
        typer.Option(
            help="With --http: where the server's log goes (said at the end); default: "
            "prensa-gateway-cost.log in the system's temporary directory."
        ),
    ] = None,
) -> None:
    """The gateway's own CPU per /embed request.

    Every model answer is memoised after its first call, so nothing but the gateway's code runs per
    request."""
    import asyncio

    from prensa.bench import gateway_cost

    require("bench", "bench gateway")
    with embedder_repository(export_dir) as repo:
        if grpc and not http:
            raise typer.BadParameter(
                "measures a served gateway: give --http too", param_hint="--grpc"
            )
        if http:
            log = log or Path(tempfile.gettempdir()) / "prensa-gateway-cost.log"
            cost = gateway_cost.measure_http(
                repo, BENCH_MODEL, requests, concurrency, log, workers, grpc
            )
            over, each = ("TEI gRPC", "Embed call") if grpc else ("HTTP", "/embed request")
            typer.echo(
                f"gateway over {over} at {concurrency} clients, {workers} worker(s): "
                f"{cost.cpu_ms_per_request * 1000:.0f} us CPU per {each}, {cost.requests_per_s:.0f} "
                f"requests/s ({cost.requests_per_cpu_s:.0f} per second of CPU); cores busy: gateway "
                f"{cost.gateway_cores:.2f}, load generator {cost.client_cores:.2f}; server log: {log}"
            )
        else:
            rounds = asyncio.run(gateway_cost.measure(repo, BENCH_MODEL, requests))
            typer.echo(
                f"gateway CPU per /embed request: best {min(rounds):.0f} us, "
                f"median {statistics.median(rounds):.0f} us"
            )


@app.command()
def tracing(
    export_dir: ExportDir,
    requests: Annotated[
        int, typer.Option(min=1, help="Requests per gateway, after 50 to warm up.")
    ] = 500,
) -> None:
    """What tracing costs a lone query.

    Three gateways on one traced Triton (tracing off, every request traced, none sampled) are asked
    in turn; spans go to a sink that drops them."""
    from prensa.bench import trace_cost

    require("bench", "bench tracing")
    with embedder_repository(export_dir) as repo:
        seconds = trace_cost.measure(repo, BENCH_MODEL, requests)
    base = statistics.median(seconds["off"])
    table = Table("tracing", "p50 ms", "mean ms", "p50 vs off")
    for name, values in seconds.items():
        table.add_row(
            name,
            f"{statistics.median(values) * 1000:.2f}",
            f"{statistics.mean(values) * 1000:.2f}",
            f"{statistics.median(values) / base:.3f}",
        )
    Console().print(table)


@app.command()
def priority(
    export_dir: ExportDir,
    passages: Annotated[
        int, typer.Option(min=8, help="Passages the batch job embeds (8 per line).")
    ] = 2400,
    queries: Annotated[int, typer.Option(min=10, help="Lone queries measured while idle.")] = 300,
) -> None:
    """A lone client's queries while a batch job saturates the server, with priority on and off.

    The job (OpenAI's Batch API, /v1/embeddings lines) runs alone and beside the queries on one
    Triton and gateway; `prensa embed-corpus` on the same passages straight to Triton is the
    throughput it is held against."""
    from prensa.bench import priority as bench_priority

    require("bench", "bench priority")
    console = Console()
    with embedder_repository(export_dir) as repo:
        rounds = bench_priority.measure(repo, BENCH_MODEL, passages, queries, console.print)
    idle = rounds[0].online
    corpus = rounds[-1].texts_per_s
    assert idle is not None and corpus is not None
    table = Table(
        "round", "online p50 ms", "online p99 ms", "p99 / idle p99", "texts/s", "vs embed-corpus"
    )
    for one in rounds:
        online, rate = one.online, one.texts_per_s
        table.add_row(
            one.name,
            f"{online.p50:.1f}" if online else "",
            f"{online.p99:.1f}" if online else "",
            f"{online.p99 / idle.p99:.2f}" if online else "",
            f"{rate:.0f}" if rate else "",
            f"{rate / corpus:.2f}" if rate else "",
        )
    console.print(table)


@app.command()
def changes(
    export_dir: ExportDir,
    clients: Annotated[int, typer.Option(min=1, help="Clients embedding without pause.")] = 64,
    steady: Annotated[
        float, typer.Option(min=1.0, help="Seconds of steady load before and after each change.")
    ] = 5.0,
) -> None:
    """Add, promote, roll back and remove a model's second version under steady load: each
    change's p99 before, during and after it, its failed requests, and its answers from a version
    that should not have answered."""
    from prensa.bench import changes as bench_changes

    require("bench", "bench changes")
    console = Console()
    with embedder_repository(export_dir) as repo:
        rows, answered = bench_changes.measure(
            repo, BENCH_MODEL, export_dir, clients, steady, console.print
        )
    table = Table(
        "change",
        "took s",
        "p99 before ms",
        "p99 during ms",
        "p99 after ms",
        "failed",
        "wrong version",
    )
    for row in rows:
        table.add_row(
            row.name,
            f"{row.seconds:.2f}",
            f"{row.p99_before_ms:.1f}",
            f"{row.p99_during_ms:.1f}",
            f"{row.p99_after_ms:.1f}",
            str(row.failed),
            str(row.wrong_version),
        )
    console.print(table)
    console.print(f"{answered} requests in all; {bench_changes.summary(rows)}")


@app.command()
def cache(
    export_dir: Annotated[
        Path, typer.Argument(help="An embedding or SPLADE export from `prensa export`.")
    ],
    requests: Annotated[
        int, typer.Option(min=1, help="Queries in the stream, sent to each Triton.")
    ] = 20_000,
    concurrency: Annotated[int, typer.Option(min=1, help="gRPC clients sending at once.")] = 4,
    distinct: Annotated[
        int, typer.Option(min=1, help="Distinct queries the stream draws from.")
    ] = 10_000,
    zipf_s: Annotated[
        float, typer.Option(help="Zipf exponent: rank k is drawn with weight k^-s.")
    ] = 1.1,
    cache_size: Annotated[
        int, typer.Option(min=1, help="Bytes of Triton's response cache.")
    ] = CACHE_BYTES,
    warmup: Annotated[
        int, typer.Option(min=0, help="Requests before measuring, outside the stream.")
    ] = 50,
    rounds: Annotated[
        int, typer.Option(min=1, help="Slices of the stream, each sent to both Tritons in turn.")
    ] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the stream.")] = 0,
) -> None:
    """What Triton's response cache buys on repeated queries.

    The export is served without and with it, both sent the same Zipf-distributed stream by gRPC
    clients straight to the ensemble."""
    from prensa.bench import cache_gain

    if reason := cache_gain.refusal(export_dir):
        raise typer.BadParameter(reason, param_hint="EXPORT_DIR")
    options = cache_gain.CacheRun(
        export_dir, requests, concurrency, distinct, zipf_s, cache_size, warmup, rounds, seed
    )
    try:
        served, stream = cache_gain.run(options)
    except ValueError as exc:  # more distinct queries than the vocabulary makes
        raise typer.BadParameter(str(exc), param_hint="'--distinct'") from exc
    typer.echo(
        f"{export_dir.name}: {requests} queries, Zipf s={zipf_s} over {distinct} distinct "
        f"({len(set(stream))} drawn), {concurrency} concurrent gRPC clients"
    )
    typer.echo(cache_gain.report(served, 1 - len(set(stream)) / len(stream)))


@app.command()
def late(
    source: Annotated[
        Path | None,
        typer.Argument(
            help="A PyLate or HF_ColBERT model directory. Default: answerai-colbert-small-v1's "
            "shape with random weights (--size)."
        ),
    ] = None,
    size: Annotated[
        str, typer.Option(help="Without SOURCE: `full` (answerai-colbert-small-v1) or `tiny`.")
    ] = "full",
    batch: Annotated[int, typer.Option(min=1, help="Texts per request.")] = 8,
    requests: Annotated[int, typer.Option(min=1, help="Requests per case, after a warm-up.")] = 48,
    concurrency: Annotated[int, typer.Option(min=1, help="Clients sending at once.")] = 4,
    work: Annotated[
        Path | None,
        typer.Option(
            help="Where the exports, repository and logs go; default: a temporary directory, "
            "removed at the end."
        ),
    ] = None,
) -> None:
    """What per-token outputs cost against pooled ones, on one encoder.

    The late-interaction model and its transformer alone (a CLS-pooled embedder) are served by one
    Triton and one gateway; documents (cut at the model's document length) and queries (expanded
    to its query length) go to `/embed_colbert` and to `/embed`. Per case: answer bytes per
    sequence, the gateway's CPU per sequence and sequences per second, with per-token / pooled."""
    from prensa.bench import late_cost
    from prensa.export import synthetic

    require("bench", "bench late")
    if size not in synthetic.COLBERT:
        raise typer.BadParameter(f"one of {', '.join(synthetic.COLBERT)}", param_hint="--size")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="prensa-bench-late-") as temporary:
        root = work or Path(temporary)
        with sigterm_exits(), step_progress(console) as step:
            if source is None:
                with step(f"Writing a {size} ColBERT with random weights"):
                    source = synthetic.colbert(root / "source", size)  # type: ignore[arg-type]
            try:
                results = late_cost.run(source, root, batch, requests, concurrency, step)
            except late_cost.NotLateInteraction as exc:
                raise typer.BadParameter(str(exc), param_hint="SOURCE") from exc
    table = Table(
        "texts",
        "output",
        "bytes / sequence",
        "gateway CPU ms / sequence",
        "sequences / s",
        "p50 ms",
    )
    pooled = {case.texts: figures for case, figures in results if case.output == "pooled"}
    for case, figures in results:
        table.add_row(
            case.texts,
            case.output,
            f"{figures.bytes_per_sequence:,.0f}",
            f"{figures.gateway_cpu_ms_per_sequence:.3f}",
            f"{figures.sequences_per_s:.1f}",
            f"{figures.p50_ms:.1f}",
        )
    console.print(table)
    for texts, base in pooled.items():
        token = next(f for c, f in results if c.texts == texts and c.output == "per-token")
        console.print(
            f"{texts}, per-token / pooled: bytes x{token.bytes_per_sequence / base.bytes_per_sequence:.1f}, "
            f"gateway CPU x{token.gateway_cpu_ms_per_sequence / max(base.gateway_cpu_ms_per_sequence, 1e-9):.2f}, "
            f"sequences/s x{token.sequences_per_s / base.sequences_per_s:.2f}"
        )
    errors = sum(figures.errors for _, figures in results)
    if errors:
        console.print(f"[red]{errors} requests failed[/]; the gateway's and Triton's logs say why")
        raise typer.Exit(1)
