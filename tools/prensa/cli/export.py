"""`prensa export`: one command from a Hub id or local directory to a servable ONNX export."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from prensa.cli.extras import require
from prensa.cli.progress import step_progress
from prensa.export import calibration
from prensa.export.pipeline import ExportFormat, ExportOptions, export_model
from prensa.export.source import SourceError
from prensa.export.tensorrt import (
    SERVING_TENSORRT,
    SERVING_TRITON,
    TensorRTError,
    TensorRTUnavailable,
)
from prensa.manifest import PairTruncation, Pooling, Task

console = Console(stderr=True)


def export(
    source: Annotated[
        str,
        typer.Argument(help="Hugging Face model id (e.g. BAAI/bge-m3) or a local model directory."),
    ],
    out: Annotated[
        Path,
        typer.Option(help="Directory to write model.onnx, tokenizer files and prensa.json into."),
    ],
    task: Annotated[
        Task | None, typer.Option(help="What the model does; detected from its files when omitted.")
    ] = None,
    pooling: Annotated[
        Pooling | None,
        typer.Option(help="Dense pooling; default from 1_Pooling/config.json, else cls."),
    ] = None,
    max_length: Annotated[
        int | None, typer.Option(help="Max tokens per text; default from the model's configs.")
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="fp32 or fp16. Default: fp32 for onnx (fp16 runs fast only on a GPU provider), fp16 for tensorrt."
        ),
    ] = None,
    dense_only: Annotated[
        bool, typer.Option(help="bge-m3 without its sparse/ColBERT head files: serve dense only.")
    ] = False,
    revision: Annotated[
        str | None, typer.Option(help="Hub revision (branch, tag or commit) to export.")
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(
            help="int8: onnxruntime dynamic quantisation for CPUs, with an accuracy report against fp32."
        ),
    ] = None,
    export_format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="onnx, or tensorrt: also build model.plan (needs TensorRT and a CUDA GPU; see docs/gpu.md).",
        ),
    ] = ExportFormat.ONNX,
    trt_max_batch: Annotated[
        int,
        typer.Option(
            help="TensorRT profile: largest batch the engine accepts (>= the repository's --max-batch-size)."
        ),
    ] = ExportOptions.trt_max_batch,
    trt_opt_batch: Annotated[
        int, typer.Option(help="TensorRT profile: the batch size kernels are tuned for.")
    ] = ExportOptions.trt_opt_batch,
    trt_opt_length: Annotated[
        int | None,
        typer.Option(
            help="TensorRT profile: the length kernels are tuned for; default min(128, max length), capped at it. The profile's max length is the export's max length."
        ),
    ] = None,
    fuse_ops: Annotated[
        bool,
        typer.Option(
            help="ONNX exports (fused in fp32, before fp16 conversion or int8 quantisation): rewrite attention, residual LayerNorm and embeddings into onnxruntime's fused kernels, kept only if the graph still agrees with torch. Turn off for a runtime without onnxruntime's own ops (TensorRT through onnxruntime)."
        ),
    ] = True,
    external_data: Annotated[
        bool,
        typer.Option(
            help="Keep the weights in one model.onnx.data file beside the graph even when they fit in it (graphs over 2 GB always do)."
        ),
    ] = False,
    calibrate: Annotated[
        bool | None,
        typer.Option(
            "--calibrate/--no-calibrate",
            help="Measure int8/uint8 embedding ranges (calibration.json) on a fixed corpus. Default: for models up to 150M parameters; larger ones take minutes on a CPU, so ask for it, or run `prensa calibrate` on the export later.",
            show_default=False,
        ),
    ] = None,
    pair_truncation: Annotated[
        PairTruncation,
        typer.Option(
            help="Cross-encoders and classifiers: how a pair longer than the max length is cut. longest_first: the longer text loses tokens first (TEI, sentence-transformers' CrossEncoder); capped_query: the query keeps at most 3/4 of the max length, the document the rest (FlagEmbedding's FlagReranker)."
        ),
    ] = ExportOptions.pair_truncation,
    pack: Annotated[
        bool | None,
        typer.Option(
            "--pack/--no-pack",
            help="Also write model.packed.onnx, the fused graph in onnxruntime's packing mode: on CUDA it computes over real tokens only, whatever the padding. Default: for fp16 ONNX exports (the GPU's format). Checked against the unpacked graph by the encode stage on CUDA when it loads.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export a model to ONNX (and optionally a TensorRT engine) plus tokenizer and manifest, and verify it."""
    require("export", "export")
    dtype = dtype or ("fp16" if export_format is ExportFormat.TENSORRT else "fp32")
    if dtype not in ("fp32", "fp16"):
        raise typer.BadParameter("--dtype must be fp32 or fp16")
    if quantize not in (None, "int8") or (quantize and dtype != "fp32"):
        raise typer.BadParameter("--quantize takes int8, from an fp32 export")
    if not 1 <= trt_opt_batch <= trt_max_batch:
        raise typer.BadParameter(
            "the TensorRT profile needs 1 <= --trt-opt-batch <= --trt-max-batch"
        )
    if quantize and export_format is ExportFormat.TENSORRT:
        raise typer.BadParameter(
            "--quantize int8 is a CPU format; TensorRT builds from fp32 (fp16 engines by default)"
        )
    options = ExportOptions(
        source=source,
        out=out,
        task=task,
        pooling=pooling,
        max_length=max_length,
        dtype=dtype,
        dense_only=dense_only,
        revision=revision,
        quantize_int8=quantize == "int8",
        format=export_format,
        trt_max_batch=trt_max_batch,
        trt_opt_batch=trt_opt_batch,
        trt_opt_length=trt_opt_length,
        fuse_ops=fuse_ops,
        external_data=external_data,
        calibrate=calibrate,
        pair_truncation=pair_truncation,
        pack=pack,
    )
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
    if dtype == "fp16" and export_format is ExportFormat.ONNX:
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
