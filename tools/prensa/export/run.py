"""One export on its way: what it is asked to make (`ExportOptions`), what it has found so far
(`VerifyReport`) and the object every step after the graph reads and extends (`ExportRun`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prensa.export.formats.onnx_graph import GraphInfo
from prensa.export.inspect import ModelPlan
from prensa.export.source import SourceModel
from prensa.manifest import LateInteraction, PairTruncation, Pooling, Task, TensorRTEngine
from prensa.options import InvalidSetting, require_positive, setting
from prensa.stages import contract

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ONNX_FILE = "model.onnx"

Step = Callable[[str], AbstractContextManager[Any]]


class ExportFormat(str, Enum):
    ONNX = "onnx"  # model.onnx in `dtype`
    TENSORRT = "tensorrt"  # model.onnx in fp32 plus model.plan in `dtype`


def int8_quantize(text: str) -> bool:
    """`--quantize`'s one value."""
    if text != "int8":
        raise ValueError(f"--quantize takes int8, got {text!r}")
    return True


@dataclass(frozen=True)
class ExportOptions:
    """What `prensa export` makes of a model: each field's default, flag and help here, its checks
    in `__post_init__`, so the command line (`prensa.cli.export`) and Python callers agree."""

    source: str = field(metadata={"flag": None})  # the command's argument
    out: Path = field(metadata={"flag": None})  # the command's --out
    _: KW_ONLY  # the rest by name
    task: Task | None = setting(None, "What the model does; detected from its files when omitted.")
    pooling: Pooling | None = setting(
        None, "Dense pooling; default from 1_Pooling/config.json, else cls."
    )
    max_length: int | None = setting(None, "Max tokens per text; default from the model's configs.")
    # of the served graph: the ONNX file, or the engine for --format tensorrt
    dtype: str | None = setting(
        None,
        "fp32 or fp16. Default: fp32 for onnx (fp16 runs fast only on a GPU provider), fp16 for "
        "tensorrt.",
    )
    dense_only: bool = setting(
        False, "bge-m3 without its sparse/ColBERT head files: serve dense only."
    )
    revision: str | None = setting(None, "Hub revision (branch, tag or commit) to export.")
    quantize_int8: bool = setting(
        False,
        "int8: onnxruntime dynamic quantisation for CPUs, with an accuracy report against fp32.",
        flag="--quantize",
        parse=int8_quantize,
    )
    format: ExportFormat = setting(
        ExportFormat.ONNX,
        "onnx, or tensorrt: also build model.plan (needs TensorRT and a CUDA GPU; see docs/gpu.md).",
        flag="--format",
    )
    # TensorRT profile; its max length is the export's
    trt_max_batch: int = setting(
        contract.DEFAULT_MAX_BATCH_SIZE,
        "TensorRT profile: largest batch the engine accepts (>= the repository's --max-batch-size).",
    )
    trt_opt_batch: int = setting(8, "TensorRT profile: the batch size kernels are tuned for.")
    trt_opt_length: int | None = setting(
        None,
        "TensorRT profile: the length kernels are tuned for; default min(128, max length), capped "
        "at it. The profile's max length is the export's max length.",
    )
    fuse_ops: bool = setting(
        True,
        "ONNX exports (fused in fp32, before fp16 conversion or int8 quantisation): rewrite "
        "attention, residual LayerNorm and embeddings into onnxruntime's fused kernels, kept only if "
        "the graph still agrees with torch. Turn off for a runtime without onnxruntime's own ops "
        "(TensorRT through onnxruntime).",
    )
    external_data: bool = setting(
        False,
        "Keep the weights in one model.onnx.data file beside the graph even when they fit in it "
        "(graphs over 2 GB always do).",
    )
    calibrate: bool | None = setting(
        None,
        "Measure int8/uint8 embedding ranges (calibration.json) on a fixed corpus. Default: for "
        "models up to 150M parameters; larger ones take minutes on a CPU, so ask for it, or run "
        "`prensa calibrate` on the export later.",
    )
    pair_truncation: PairTruncation = setting(
        PairTruncation.LONGEST_FIRST,
        "Cross-encoders and classifiers: how a pair longer than the max length is cut. "
        "longest_first: the longer text loses tokens first (TEI, sentence-transformers' "
        "CrossEncoder); capped_query: the query keeps at most 3/4 of the max length, the document "
        "the rest (FlagEmbedding's FlagReranker).",
    )
    pack: bool | None = setting(
        None,
        "Also write model.packed.onnx, the fused graph in onnxruntime's packing mode: on CUDA it "
        "computes over real tokens only, whatever the padding. Default: for fp16 ONNX exports (the "
        "GPU's format). Checked against the unpacked graph by the encode stage on CUDA when it loads.",
    )

    @property
    def served_dtype(self) -> str:
        """`dtype`, or the format's default: fp16 for a TensorRT engine, fp32 for an ONNX graph."""
        if self.dtype is not None:
            return self.dtype
        return "fp16" if self.format is ExportFormat.TENSORRT else "fp32"

    def __post_init__(self) -> None:
        if self.served_dtype not in ("fp32", "fp16"):
            raise InvalidSetting("dtype", f"must be fp32 or fp16, got {self.dtype}")
        if self.quantize_int8 and self.served_dtype != "fp32":
            raise InvalidSetting("quantize_int8", "takes int8, from an fp32 export")
        if self.quantize_int8 and self.format is ExportFormat.TENSORRT:
            raise InvalidSetting(
                "quantize_int8",
                "int8 is a CPU format; TensorRT builds from fp32 (fp16 engines by default)",
            )
        require_positive(self, "max_length", "trt_max_batch", "trt_opt_batch", "trt_opt_length")
        if self.trt_opt_batch > self.trt_max_batch:
            raise ValueError("the TensorRT profile needs 1 <= --trt-opt-batch <= --trt-max-batch")


@dataclass(frozen=True)
class VerifyReport:
    """One line per graph output: the figure checked and whether it passed."""

    heading: str
    figures: dict[str, str]
    ok: bool


@dataclass
class ExportRun:
    """One export on its way: what every step after the graph reads (the source, its tokenizer, the
    plan, the options, the progress display) and what the steps before it left (the graph written
    into `options.out`, the report so far, a TensorRT engine, a packed graph)."""

    source: SourceModel
    config: dict[str, Any]
    tokenizer: PreTrainedTokenizerBase
    plan: ModelPlan
    options: ExportOptions
    step: Step
    prompts: tuple[dict[str, str], str | None]
    late_interaction: LateInteraction | None
    graph: GraphInfo
    report: VerifyReport
    engine: TensorRTEngine | None = None
    packed_file: str | None = None
    packed_checked: bool = False

    def add_figures(
        self, figures: dict[str, str], ok: bool = True, heading: str | None = None
    ) -> None:
        """The report with `figures` added (and failed unless `ok`)."""
        self.report = VerifyReport(
            heading or self.report.heading,
            {**self.report.figures, **figures},
            self.report.ok and ok,
        )
