"""`prensa export`: one command from a Hub id or local directory to a servable ONNX export."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from prensa.export.pipeline import ExportOptions, export_model
from prensa.export.source import SourceError
from prensa.manifest import Pooling, Task

console = Console(stderr=True)


def export(
    source: Annotated[str, typer.Argument(help="Hugging Face model id (e.g. BAAI/bge-m3) or a local model directory.")],
    out: Annotated[Path, typer.Option(help="Directory to write model.onnx, tokenizer files and prensa.json into.")],
    task: Annotated[Optional[Task], typer.Option(help="What the model does; detected from its files when omitted.")] = None,
    pooling: Annotated[Optional[Pooling], typer.Option(help="Dense pooling; default from 1_Pooling/config.json, else cls.")] = None,
    max_length: Annotated[Optional[int], typer.Option(help="Max tokens per text; default from the model's configs.")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, or fp16 (fp16 runs fast only on a GPU execution provider).")] = "fp32",
    dense_only: Annotated[bool, typer.Option(help="bge-m3 without its sparse/ColBERT head files: serve dense only.")] = False,
    revision: Annotated[Optional[str], typer.Option(help="Hub revision (branch, tag or commit) to export.")] = None,
    quantize: Annotated[Optional[str], typer.Option(help="int8: onnxruntime dynamic quantisation for CPUs, with an accuracy report against fp32.")] = None,
) -> None:
    """Export a model to ONNX plus tokenizer and manifest, and verify it against torch."""
    if dtype not in ("fp32", "fp16"):
        raise typer.BadParameter("--dtype must be fp32 or fp16")
    if quantize not in (None, "int8") or (quantize and dtype != "fp32"):
        raise typer.BadParameter("--quantize takes int8, from an fp32 export")
    options = ExportOptions(source, out, task, pooling, max_length, dtype, dense_only, revision, quantize == "int8")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:

        @contextmanager
        def step(description: str):
            handle = progress.add_task(description, total=1)
            yield
            progress.update(handle, completed=1, description=f"[green]✓[/] {description}")

        try:
            manifest, report = export_model(options, step)
        except SourceError as exc:
            failure = exc
        else:
            failure = None
    if failure is not None:
        console.print(f"[red]error:[/] {failure}")
        raise typer.Exit(2) from failure
    table = Table("graph output", report.heading, title=f"{manifest.task.value} export of {manifest.source}")
    for name, figure in report.figures.items():
        table.add_row(name, figure)
    console.print(table)
    if dtype == "fp16":
        console.print("[yellow]fp16:[/] onnxruntime's CPU provider runs fp16 graphs slowly; serve it on a GPU.")
    if not report.ok:
        console.print("[red]error:[/] the exported graph failed its check (table above)")
        raise typer.Exit(1)
    console.print(f"wrote {out} (task {manifest.task.value}, max length {manifest.max_length}, revision {manifest.revision})")
