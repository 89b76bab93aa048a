"""`prensa embed-corpus`: a whole corpus into Parquet, through a prensa endpoint, in-process, or on Ray."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prensa.addresses import TRITON_GRPC_URL
from prensa.cli.extras import require
from prensa.corpus import HEAL_WAIT_S


def embed_corpus(
    input: Annotated[
        Path,
        typer.Argument(
            help="JSONL or Parquet file, or a directory of them, with an id and a text column."
        ),
    ],
    output: Annotated[
        Path,
        typer.Argument(help="Directory of Parquet parts; run the same command again to resume."),
    ],
    triton_url: Annotated[
        str, typer.Option(help="Triton gRPC address of a prensa server.")
    ] = TRITON_GRPC_URL,
    model: Annotated[
        str | None, typer.Option(help="Ensemble to call on Triton (an embed, m3 or splade model).")
    ] = None,
    export: Annotated[
        Path | None,
        typer.Option(
            help="Instead of Triton: run this `prensa export` directory in-process with onnxruntime."
        ),
    ] = None,
    outputs: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated dense, sparse, colbert; default every one the model has but colbert."
        ),
    ] = None,
    id_column: Annotated[str, typer.Option(help="Input column with unique ids.")] = "id",
    text_column: Annotated[str, typer.Option(help="Input column with the texts.")] = "text",
    rows_per_part: Annotated[
        int,
        typer.Option(
            help="Rows per Parquet part: the unit of progress and of work redone after a crash."
        ),
    ] = 2048,
    batch_size: Annotated[
        int, typer.Option(help="Texts per request; 0 = the served model's max_batch_size.")
    ] = 0,
    concurrency: Annotated[
        int, typer.Option(help="Triton requests in flight (per Ray worker).")
    ] = 4,
    threads: Annotated[
        int,
        typer.Option(
            help="--export: onnxruntime threads; 0 = every core (on Ray: the worker's CPUs)."
        ),
    ] = 0,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Run on this Ray cluster (`auto`, `ray://host:10001`), or `local` to start Ray here."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="Ray: actors embedding in parallel, each with its own client or session."
        ),
    ] = 2,
    cpus_per_worker: Annotated[float, typer.Option(help="Ray: CPUs reserved per actor.")] = 1.0,
    heal_wait: Annotated[
        float,
        typer.Option(
            help="Seconds a request is sent again while Triton is unreachable or the model is not "
            "ready (`prensa serve` restarts and reloads it), before the run stops; resumable."
        ),
    ] = HEAL_WAIT_S,
) -> None:
    """Embed INPUT's texts into Parquet under OUTPUT: dense, sparse and/or ColBERT columns, resumable."""
    require("corpus", "embed-corpus")
    from prensa.corpus.backends import BackendError, BackendSpec
    from prensa.corpus.io import Columns, CorpusError  # pyarrow: the corpus extra
    from prensa.corpus.local import Job, run_local

    console = Console(stderr=True)
    job = Job(input, output, Columns(id_column, text_column), outputs, rows_per_part)
    try:
        spec = BackendSpec(
            triton_url=None if export else triton_url,
            model=model,
            export_dir=export,
            batch_size=batch_size,
            concurrency=concurrency,
            threads=threads,
            heal_wait_s=heal_wait,
        )
        if ray_address is None:
            summary = run_local(job, spec, console)
        elif importlib.util.find_spec("ray") is None:
            raise BackendError("--ray-address needs Ray: pip install 'prensa[distributed]'")
        else:
            from prensa.corpus.ray_runner import run_on_ray

            summary = run_on_ray(job, spec, ray_address, workers, cpus_per_worker, console)
    except (BackendError, CorpusError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    if summary.removed:
        console.print(f"deleted {len(summary.removed)} incomplete files of an interrupted run")
    console.print(
        f"{summary.written} rows embedded ({', '.join(summary.kinds)}) in {summary.seconds:.1f} s, "
        f"{summary.rows_per_s:.1f} rows/s; {summary.skipped} of {summary.total} were already in {output}"
    )
