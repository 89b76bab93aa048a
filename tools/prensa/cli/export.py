"""`prensa export`: one command from a Hub id or local directory to a servable ONNX export."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from prensa.cli.extras import require
from prensa.cli.options import with_options
from prensa.cli.progress import step_progress
from prensa.export.formats import calibration
from prensa.export.formats.tensorrt import (
    SERVING_TENSORRT,
    SERVING_TRITON,
    TensorRTError,
    TensorRTUnavailable,
)
from prensa.export.pipeline import ExportFormat, ExportOptions, export_model
from prensa.export.source import SourceError

console = Console(stderr=True)


@with_options(ExportOptions, "options", passed=("source", "out"))
def export(
    source: Annotated[
        str,
        typer.Argument(help="Hugging Face model id (e.g. BAAI/bge-m3) or a local model directory."),
    ],
    out: Annotated[
        Path,
        typer.Option(help="Directory to write model.onnx, tokenizer files and prensa.json into."),
    ],
    options: ExportOptions,
) -> None:
    """Export a model to ONNX (and optionally a TensorRT engine) plus tokenizer and manifest, and verify it."""
    require("export", "export")
    failure: SourceError | TensorRTUnavailable | TensorRTError | None
    with step_progress(console) as step:
        try:
            manifest, report = export_model(options, step)
        except (SourceError, TensorRTUnavailable, TensorRTError) as exc:
            failure = exc
        else:
            failure = None
    if failure is not None:
        console.print(f"[red]error:[/] {failure}")
        raise typer.Exit(2) from failure
    table = Table(
        "graph output", report.heading, title=f"{manifest.task.value} export of {manifest.source}"
    )
    for name, figure in report.figures.items():
        table.add_row(name, figure)
    console.print(table)
    if options.served_dtype == "fp16" and options.format is ExportFormat.ONNX:
        console.print(
            "[yellow]fp16:[/] onnxruntime's CPU provider runs fp16 graphs slowly; serve it on a GPU."
        )
    engine = manifest.tensorrt
    if engine and not engine.tensorrt_version.startswith(SERVING_TENSORRT + "."):
        console.print(
            f"[yellow]TensorRT {engine.tensorrt_version}:[/] compose.yaml's Triton {SERVING_TRITON} loads only "
            f"TensorRT {SERVING_TENSORRT} engines; serve this plan with a Triton release built on "
            f"TensorRT {engine.tensorrt_version}."
        )
    if not report.ok:
        console.print("[red]error:[/] the exported graph failed its check (table above)")
        raise typer.Exit(1)
    console.print(
        f"wrote {out} (task {manifest.task.value}, max length {manifest.max_length}, revision {manifest.revision})"
    )


def calibrate(
    export_dir: Annotated[
        Path, typer.Argument(help="An embedding export from `prensa export` (its prensa.json).")
    ],
) -> None:
    """Measure an embedding export's int8/uint8 ranges (calibration.json) after the fact; rebuild the repository to serve them."""
    require("export", "calibrate")
    try:
        with (
            step_progress(console) as step,
            step(f"Calibrating int8 embedding ranges on {calibration.CORPUS_TEXTS} texts"),
        ):
            result = calibration.calibrate_export(export_dir)
    except (FileNotFoundError, ValueError, calibration.CalibrationUnavailable) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(
        f"{export_dir}: {calibration.describe(result)}; run `prensa repo build` again to serve them"
    )
