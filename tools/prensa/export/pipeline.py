"""`prensa export`: model directory or Hub id -> ONNX graph + tokenizer + manifest, verified.

Two paths end in the same export layout: a torch model is traced (and checked against torch),
a directory that already holds `model.onnx` is adopted as it is (and checked to run and to
produce the outputs its task needs)."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
import psutil

from prensa.export import calibration, llm_reranker, packing
from prensa.export.graph_store import move_graph, remove_staging, rewrite_graph, save_graph, staging
from prensa.export.inspect import (
    ModelPlan,
    plan_model,
    read_own_files,
    require_memory,
    require_native_code,
)
from prensa.export.late import interaction, write_tokenizers
from prensa.export.onnx_graph import GraphInfo, describe_graph, task_from_outputs
from prensa.export.source import SourceError, SourceModel, resolve_source
from prensa.export.st_layout import lowercase_first, lowercases
from prensa.files import GraphDataError, link_graph_files
from prensa.layouts import Layout, of_manifest
from prensa.manifest import (
    CALIBRATION_FILE,
    GraphOutput,
    LateInteraction,
    Manifest,
    PairTruncation,
    Pooling,
    Task,
    TensorRTEngine,
)
from prensa.options import InvalidSetting, require_positive, setting
from prensa.stages import contract, load_stage

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

ONNX_FILE = "model.onnx"
FUSED_FIGURE = "fused ops"  # the report line that says which fusions were kept, or why none
PACKED_FIGURE = "packed graph"  # the report line that names the packed graph, or why there is none
OPSET = 17
TOKEN_INPUTS = (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
# Texts of different lengths, so verification covers padding inside a batch.
VERIFY_TEXTS = [
    "What is the capital of Germany?",
    "Berlin is the capital and largest city of Germany, with about 3.9 million inhabitants.",
    "ok",
    "Dense retrieval encodes queries and passages into vectors and ranks passages by similarity; "
    "sparse retrieval weights individual terms; late interaction keeps one vector per token.",
]
FP32_TOLERANCE = 1e-3
# FlagReranker's default; bge-reranker-v2-m3's tokenizer allows 8192
ST_CONFIG = "config_sentence_transformers.json"  # sentence-transformers' prompts live here
# sentence-transformers' files, copied unchanged: the pooling, length and prompts read from them stay with the graph.
ST_FILES = ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json", ST_CONFIG)

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


def _no_progress(_: str) -> AbstractContextManager[Any]:
    return nullcontext()


def special_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids never reported as lexical terms (FlagEmbedding drops cls, eos, pad and unk)."""
    names = (
        "cls_token_id",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "pad_token_id",
        "unk_token_id",
    )
    return sorted({getattr(tokenizer, n) for n in names if getattr(tokenizer, n, None) is not None})


def sample_batch(
    tokenizer: PreTrainedTokenizerBase,
    kind: Layout,
    max_length: int,
    template: dict[str, str] | None = None,
    prompt: str | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """The verification texts as the stages feed the encoder: padded on the right, whatever side the
    tokenizer pads by itself; an LLM reranker's pairs written into its prompt; `prompt` before each
    text, its tokens marked as the gateway marks a prompt that the pooling leaves out."""
    if template is not None:
        return llm_reranker.sample_rows(
            tokenizer, template, [VERIFY_TEXTS[0]] * 3, VERIFY_TEXTS[1:], max_length
        )
    if kind.pair_input is not None:  # a cross-encoder's or classifier's pairs
        queries, passages = [VERIFY_TEXTS[0]] * 3, VERIFY_TEXTS[1:]
        encoded = tokenizer(
            queries,
            passages,
            padding=True,
            truncation=True,  # longest_first: short pairs here, cut by no rule
            max_length=max_length,
            return_tensors="np",
            padding_side="right",
        )
    else:
        texts = [(prompt or "") + text for text in VERIFY_TEXTS]
        encoded = tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="np",
            padding_side="right",
        )
    sample = {k: v.astype(np.int64) for k, v in encoded.items()}
    if kind.token_vectors:  # a late model's query expansion token: read, attended to by none
        mask = sample[contract.ATTENTION_MASK]
        mask[0, int(np.count_nonzero(mask[0])) - 1] = contract.UNATTENDED_TOKEN
    if prompt:
        skipped = load_stage("tokenize").prompt_length(tokenizer.backend_tokenizer, prompt)
        sample[contract.ATTENTION_MASK] = contract.mark_prompts(
            sample[contract.ATTENTION_MASK], [skipped] * len(texts)
        )
    return sample


def _check_pair_truncation(source: SourceModel, plan: ModelPlan, rule: PairTruncation) -> None:
    """Only a cross-encoder's or classifier's pairs have two texts to cut by a rule: refuse another
    rule where it would change nothing (an LLM reranker cuts its one filled-in prompt)."""
    if rule is PairTruncation.LONGEST_FIRST:
        return
    if plan.kind.pair_input is None or plan.kind.prompted_pairs:
        kind = "an LLM reranker" if plan.template is not None else f"a {plan.task} model"
        raise SourceError(
            f"{source.name}: --pair-truncation {rule} applies to cross-encoders and classifiers, "
            f"not to {kind}"
        )


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _attention_heads(config: dict[str, Any]) -> int | None:
    """Attention heads of the transformer (a classifier's or a causal LM's config may nest its text model's)."""
    heads = config.get("num_attention_heads") or (config.get("text_config") or {}).get(
        "num_attention_heads"
    )
    return int(heads) if heads else None


def _read_config(source: SourceModel) -> dict[str, Any]:
    return (
        json.loads((source.path / "config.json").read_text()) if source.has("config.json") else {}
    )


def read_prompts(source: SourceModel) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' `prompts` and `default_prompt_name`; a file that sentence-transformers
    itself would refuse is refused here too, before it reaches clients."""
    config = json.loads((source.path / ST_CONFIG).read_text()) if source.has(ST_CONFIG) else {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise SourceError(
            f"{source.name}: {ST_CONFIG}'s prompts must map names to texts, got {prompts!r}"
        )
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise SourceError(
            f"{source.name}: {ST_CONFIG}'s default_prompt_name {default!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return prompts, default


def read_matryoshka(source: SourceModel, config: dict[str, Any]) -> list[int] | None:
    """The Matryoshka dimensions the model declares: a `matryoshka_dimensions` list (its config.json
    or sentence-transformers' config), [] for sentence-transformers' `truncate_dim` alone (trained to
    be cut, no list of where), None when it declares neither."""
    st_config = json.loads((source.path / ST_CONFIG).read_text()) if source.has(ST_CONFIG) else {}
    listed = config.get("matryoshka_dimensions") or st_config.get("matryoshka_dimensions")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(d, int) and d > 0 for d in listed):
            raise SourceError(
                f"{source.name}: matryoshka_dimensions must list positive sizes, got {listed!r}"
            )
        return sorted(set(listed))
    return [] if isinstance(st_config.get("truncate_dim"), int) else None


def _plan(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    config: dict[str, Any],
    options: ExportOptions,
    task: Task | None,
    prompts: dict[str, str],
) -> ModelPlan:
    pad_offset = (
        (config.get("pad_token_id") or 0) + 1
        if config.get("model_type") in ("xlm-roberta", "roberta")
        else 0
    )
    positions = config.get("max_position_embeddings")
    plan = plan_model(
        source,
        list(config.get("architectures") or []),
        task,
        options.pooling,
        options.max_length,
        options.dense_only,
        getattr(tokenizer, "model_max_length", None),
        positions - pad_offset if positions else None,
        prompts,
    )
    default = plan.kind.default_max_length
    if default is not None and options.max_length is None:
        plan = dataclasses.replace(plan, max_length=min(plan.max_length, default))
    if plan.template is not None:
        llm_reranker.require_room(tokenizer, plan.template, plan.max_length, source.name)
    return plan


def _trace(
    graph: nn.Module,
    inputs: list[str],
    outputs: list[GraphOutput],
    sample: dict[str, npt.NDArray[Any]],
    path: Path,
) -> None:
    """torch's trace at `path`; over 2 GB torch writes one weights file per tensor beside it."""
    import torch

    args = tuple(torch.from_numpy(sample[name]) for name in inputs)
    axes = {name: {0: "batch", 1: "tokens"} for name in inputs}
    axes.update(
        {o.name: ({0: "batch", 1: "tokens"} if o.per_token else {0: "batch"}) for o in outputs}
    )
    with torch.no_grad():
        torch.onnx.export(
            graph,
            args,
            str(path),
            input_names=inputs,
            output_names=[o.name for o in outputs],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )


def _trace_into(
    graph: nn.Module,
    inputs: list[str],
    outputs: list[GraphOutput],
    sample: dict[str, npt.NDArray[Any]],
    path: Path,
    external: bool,
) -> None:
    """The trace, written at `path` in the export's layout: torch's per-tensor files (a graph over
    2 GB) are gathered into one data file beside the graph."""
    with staging(path.parent, "trace") as folder:
        traced = Path(folder) / path.name
        _trace(graph, inputs, outputs, sample, traced)
        rewrite_graph(traced, path, external)


def _to_fp16(source: Path, target: Path, external: bool) -> None:
    """fp16 weights and compute, fp32 inputs/outputs; LayerNorm and softmax stay fp32 (overflow).
    TensorRT builds from the same graph, strongly typed, so both keep those layers in fp32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # By path: onnxruntime then infers shapes from the file, which works past 2 GB (in memory it cannot).
    converted = convert_float_to_float16(
        str(source),
        keep_io_types=True,
        op_block_list=["LayerNormalization", "Softmax", "Pow", "ReduceMean", "Sqrt"],
    )
    save_graph(converted, target, external)


def run_torch(
    graph: nn.Module, inputs: list[str], sample: dict[str, npt.NDArray[Any]]
) -> list[npt.NDArray[Any]]:
    """Reference outputs, a decoder's with transformers' own masks (the trace gets masks built for
    it); taken before tracing, which can leave the torch module altered."""
    import torch

    from prensa.export.graphs import transformers_masks

    with torch.no_grad(), transformers_masks(graph):
        expected = graph(*(torch.from_numpy(sample[n]) for n in inputs))
    return [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]


def run_onnx(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    provider: str = "CPUExecutionProvider",
) -> dict[str, npt.NDArray[Any]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=[provider])
    values = session.run(None, {n: sample[n] for n in inputs})
    return {meta.name: value for meta, value in zip(session.get_outputs(), values)}


def agreement_report(
    heading: str,
    actual: dict[str, npt.NDArray[Any]],
    expected: dict[str, npt.NDArray[Any]],
    mask: npt.NDArray[Any],
    outputs: list[GraphOutput],
    prefix: str = "",
) -> VerifyReport:
    """Cosine against fp32 per output; passes at MIN_COSINE or above."""
    from prensa.export.agreement import MIN_COSINE, agreement

    figures = agreement(actual, expected, mask, {o.name for o in outputs if o.per_token})
    return VerifyReport(
        f"{heading}, min cosine >= {MIN_COSINE}",
        {
            f"{prefix}{name}": f"min cosine {cos:.6f}, max |diff| {diff:.2e}"
            for name, (cos, diff) in figures.items()
        },
        all(cos >= MIN_COSINE for cos, _ in figures.values()),
    )


def check_fp16(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    outputs: list[GraphOutput],
) -> VerifyReport:
    """The fp16 graph against fp32 torch, on onnxruntime's CUDA provider when there is one, else its
    CPU provider; when neither runs the graph, the check is skipped and the report says why."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, Fail
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

    provider = (
        "CUDAExecutionProvider"
        if "CUDAExecutionProvider" in ort.get_available_providers()
        else "CPUExecutionProvider"
    )
    try:
        actual = run_onnx(path, inputs, sample, provider)
    except (EPFail, Fail, NoKernel) as exc:  # e.g. a provider without fp16 kernels for some op
        reason = str(exc).splitlines()[0]
        return VerifyReport(
            "fp16 accuracy check", {"skipped": f"{provider} cannot run this graph: {reason}"}, True
        )
    reference = {o.name: value for o, value in zip(outputs, expected)}
    return agreement_report(
        f"onnxruntime fp16 ({provider}) vs fp32 torch",
        actual,
        reference,
        sample[contract.ATTENTION_MASK],
        outputs,
    )


def compare_with_torch(
    actual: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    mask: npt.NDArray[Any],
    dtype: str,
) -> VerifyReport:
    figures, worst = {}, 0.0
    for (name, got), want in zip(actual.items(), expected):
        delta = np.abs(want - got)
        if delta.ndim >= 2 and delta.shape[:2] == mask.shape:
            delta = delta[mask.astype(bool)]  # padded positions are free to differ
        diff = float(delta.max()) if delta.size else 0.0
        figures[name], worst = f"max |onnx - torch| {diff:.2e}", max(worst, diff)
    ok = dtype != "fp32" or worst <= FP32_TOLERANCE
    return VerifyReport(
        f"onnxruntime vs torch ({'tolerance ' + str(FP32_TOLERANCE) if dtype == 'fp32' else dtype})",
        figures,
        ok,
    )


def check_adopted(
    actual: dict[str, npt.NDArray[Any]], outputs: list[GraphOutput], rows: int
) -> VerifyReport:
    figures, ok = {}, True
    for output in outputs:
        value = actual[output.name]
        good = value.shape[0] == rows and bool(np.isfinite(value).all())
        figures[output.name] = (
            f"shape {list(value.shape)}, {'finite' if good else 'NOT FINITE OR WRONG ROWS'}"
        )
        ok &= good
    return VerifyReport("adopted graph run on a sample batch", figures, ok)


def _fuse_checked(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    plain: VerifyReport,
    external: bool,
) -> tuple[dict[str, int], VerifyReport]:
    """Swap in the fused graph when it agrees with torch within the plain graph's tolerance; the
    report says which graph was kept and why."""
    import onnx

    from prensa.export.fusion import fuse_transformer_ops

    def kept_plain(reason: str) -> tuple[dict[str, int], VerifyReport]:
        return {}, VerifyReport(plain.heading, {**plain.figures, FUSED_FIGURE: reason}, plain.ok)

    with staging(path.parent, "fused") as folder:
        # same name: the graph names its data file after itself
        fused_path = Path(folder) / path.name
        structure = onnx.load(str(path), load_external_data=False)  # fusion rewrites this copy
        fused = fuse_transformer_ops(structure, fused_path, external, weights_dir=path.parent)
        if not fused:
            return kept_plain("none matched; kept as traced")
        checked = compare_with_torch(
            run_onnx(fused_path, inputs, sample), expected, sample[contract.ATTENTION_MASK], "fp32"
        )
        if not checked.ok:
            return kept_plain(
                f"not kept, it disagrees with torch ({'; '.join(checked.figures.values())})"
            )
        move_graph(fused_path, path)
    counts = ", ".join(f"{op} x{count}" for op, count in fused.items())
    return fused, VerifyReport(checked.heading, {**checked.figures, FUSED_FIGURE: counts}, True)


def served_values(
    outputs: dict[str, npt.NDArray[Any]], sample: dict[str, npt.NDArray[Any]], plan: ModelPlan
) -> npt.NDArray[Any]:
    """What clients receive for the sample, from the graph's outputs through the pool stage: dense
    vectors, or SPLADE's vocabulary weights (the pool stage lists their non-zero ones)."""
    if contract.SPLADE_WEIGHTS in outputs:
        return outputs[contract.SPLADE_WEIGHTS]
    if contract.LOGITS in outputs:  # one-label scores: the pool stage's sigmoid
        return cast(
            npt.NDArray[Any], load_stage("pool").activate(outputs[contract.LOGITS], "sigmoid")
        )
    return calibration.served_dense(outputs, sample, plan.pooling, plan.normalize)


@dataclass(frozen=True)
class Reference:
    """What the model's own library answers for the sample, which the served values must equal."""

    name: str  # the report's line: sentence-transformers, or the model card
    values: npt.NDArray[Any]
    described: str  # what the served values are compared with, in the report


def check_reference(
    actual: dict[str, npt.NDArray[Any]],
    sample: dict[str, npt.NDArray[Any]],
    plan: ModelPlan,
    reference: Reference,
    report: VerifyReport,
) -> VerifyReport:
    """The served values against the reference: the check a layout read wrongly (a Dense layer
    skipped, the wrong pooling, padding or LM-head rows) cannot pass."""
    from prensa.export.agreement import (
        REFERENCE_MAX_DIFF,
        REFERENCE_MIN_COSINE,
        reference_agreement,
    )

    diff, cosine = reference_agreement(served_values(actual, sample, plan), reference.values)
    ok = diff <= REFERENCE_MAX_DIFF and cosine >= REFERENCE_MIN_COSINE
    figure = f"served vs {reference.described}: max |diff| {diff:.2e}, min cosine {cosine:.6f}" + (
        ""
        if ok
        else f" (needs <= {REFERENCE_MAX_DIFF:.0e} and >= {REFERENCE_MIN_COSINE}): prensa does not "
        f"serve this model as {reference.name} does"
    )
    return VerifyReport(
        report.heading, {**report.figures, reference.name: figure}, report.ok and ok
    )


def _load_graph(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    sample: dict[str, npt.NDArray[Any]],
) -> tuple[nn.Module, list[GraphOutput], Reference | None]:
    """The torch module to trace, its outputs, and what the model's own library answers for the
    sample (sentence-transformers' `encode`, the LLM reranker card's formula), taken before tracing."""
    if plan.own is not None:
        graph, outputs = plan.own.graph()
        values = plan.own.reference(source, VERIFY_TEXTS)
        return graph, outputs, Reference(plan.own.library, values, "encode")
    if plan.layout is not None:  # sentence-transformers' modules: an embedder's or SPLADE's
        from prensa.export import sentence

        model = sentence.load_sentence_model(source.path, plan.layout, plan.max_length)
        graph, outputs = sentence.sentence_graph(model, plan.layout)
        values = sentence.reference(model, plan.layout, VERIFY_TEXTS, plan.verify_prompt)
        return graph, outputs, Reference(sentence.FIGURE, values, "encode")
    if plan.late is not None:
        from prensa.export.late import late_graph

        graph, outputs = late_graph(source, plan.late)
        return graph, outputs, None
    if plan.template is not None:
        causal, no_id, yes_id = llm_reranker.load(source.path, tokenizer, source.name)
        graph, outputs = llm_reranker.reranker_graph(causal, no_id, yes_id)
        values = llm_reranker.reference(causal, no_id, yes_id, sample)
        return (
            graph,
            outputs,
            Reference(llm_reranker.FIGURE, values, "the card's softmax over no/yes"),
        )
    from prensa.export.graphs import build_graph

    graph, outputs = build_graph(plan.kind, source.path)
    return graph, outputs, None


def _export_torch(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    options: ExportOptions,
    dtype: str,
    fuse: bool,
    step: Step,
) -> tuple[GraphInfo, VerifyReport]:
    from prensa.export.graphs import takes_token_types

    with step(f"Loading {plan.task.value} model"):
        sample = sample_batch(
            tokenizer, plan.kind, plan.max_length, plan.template, plan.verify_prompt
        )
        graph, outputs, reference = _load_graph(source, tokenizer, plan, sample)
        inputs = [
            n
            for n in TOKEN_INPUTS
            if n in tokenizer.model_input_names
            and (n != contract.TOKEN_TYPE_IDS or takes_token_types(graph))
        ]
        expected = run_torch(graph, inputs, sample)
    onnx_path = options.out / ONNX_FILE
    with step(f"Tracing to ONNX (opset {OPSET})"):
        try:
            _trace_into(graph, inputs, outputs, sample, onnx_path, options.external_data)
        except RuntimeError as exc:  # torch's tracer and exporter raise plain RuntimeErrors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(
                f"{source.name} does not trace to ONNX with torch {_torch_version()}: {first}"
            ) from exc
        del graph  # the torch weights: as large as the graph's, and not needed past the trace
        gc.collect()
    with step("Verifying onnxruntime against torch"):
        report = compare_with_torch(
            run_onnx(onnx_path, inputs, sample), expected, sample[contract.ATTENTION_MASK], "fp32"
        )
    fused: dict[str, int] = {}
    if fuse and report.ok:  # in fp32, before any fp16 conversion: its casts hide the patterns
        with step("Fusing transformer ops for onnxruntime, checking against torch"):
            fused, report = _fuse_checked(
                onnx_path, inputs, sample, expected, report, options.external_data
            )
    if reference is not None and report.ok:
        with step(f"Checking what prensa serves against {reference.described}"):
            report = check_reference(
                run_onnx(onnx_path, inputs, sample), sample, plan, reference, report
            )
    # a trace that disagrees with torch stays fp32; the report says why
    if dtype == "fp32" or not report.ok:
        return GraphInfo(inputs, outputs, "fp32", fused), report
    with step("Converting to fp16 (LayerNorm and softmax kept in fp32)"):
        _to_fp16(onnx_path, onnx_path, options.external_data)
    with step("Checking fp16 against fp32 on a sample"):
        checked = check_fp16(onnx_path, inputs, sample, expected, outputs)
    # the fp32 fusion step's figure
    fusion = {k: v for k, v in report.figures.items() if k == FUSED_FIGURE}
    return GraphInfo(inputs, outputs, dtype, fused), VerifyReport(
        checked.heading, {**checked.figures, **fusion}, checked.ok
    )


def _adopt_onnx(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    graph: GraphInfo,
    options: ExportOptions,
    step: Step,
) -> tuple[GraphInfo, VerifyReport]:
    with step(f"Adopting {ONNX_FILE} ({graph.dtype}) without re-exporting"):
        try:
            link_graph_files(source.path, options.out, ONNX_FILE)
        except GraphDataError as exc:
            raise SourceError(str(exc)) from exc
    with step("Running the adopted graph on a sample batch"):
        sample = sample_batch(tokenizer, plan.kind, plan.max_length)
        report = check_adopted(
            run_onnx(options.out / ONNX_FILE, graph.inputs, sample),
            graph.outputs,
            sample[contract.INPUT_IDS].shape[0],
        )
    return graph, report


def _quantize(run: ExportRun) -> None:
    """Swap the fp32 graph in `out` for its int8 version; add the agreement figures to the report."""
    from prensa.export.quantize import quantize_with_report

    graph, tokenizer, plan = run.graph, run.tokenizer, run.plan
    options, step = run.options, run.step
    if graph.dtype != "fp32":
        raise SourceError(f"--quantize int8 needs an fp32 graph; this one is {graph.dtype}")
    with staging(options.out, "fp32") as folder:
        fp32 = Path(folder) / ONNX_FILE
        move_graph(options.out / ONNX_FILE, fp32)  # with its data file: the graph names it
        try:
            with step(
                "Quantising to int8 (per-tensor and per-channel) and comparing with fp32 on the workload"
            ):
                result = quantize_with_report(
                    fp32,
                    options.out / ONNX_FILE,
                    graph.inputs,
                    tokenizer,
                    plan.kind,
                    plan.pooling,
                    plan.max_length,
                    options.external_data,
                    plan.template,
                )
        except BaseException:
            # a failed quantisation leaves the fp32 export as it was
            move_graph(fp32, options.out / ONNX_FILE)
            raise
    figures = {}
    for label, values in result.figures.items():
        kept = " (kept)" if (label == "per-channel") == result.per_channel else ""
        figures[f"int8 {label}{kept}"] = ", ".join(f"{k} {v:.4f}" for k, v in values.items())
    run.graph = GraphInfo(graph.inputs, graph.outputs, "int8", graph.fused_ops)
    run.add_figures(figures)


def _build_tensorrt(run: ExportRun) -> None:
    """model.plan beside the fp32 model.onnx, checked against it through the TensorRT runtime."""
    from prensa.export import tensorrt

    graph, tokenizer, plan = run.graph, run.tokenizer, run.plan
    options, step = run.options, run.step
    if graph.dtype != "fp32":
        raise SourceError(f"--format tensorrt builds from an fp32 graph; this one is {graph.dtype}")
    profile = tensorrt.engine_profile(
        plan.max_length, options.trt_max_batch, options.trt_opt_batch, options.trt_opt_length
    )
    onnx_path, plan_path = options.out / ONNX_FILE, options.out / tensorrt.ENGINE_FILE
    sample = sample_batch(tokenizer, plan.kind, plan.max_length)
    with step("Running the fp32 graph for reference outputs"):
        expected = run_onnx(onnx_path, graph.inputs, sample)
    with tempfile.TemporaryDirectory(dir=options.out) as staging:
        source = onnx_path
        if options.served_dtype == "fp16":
            source = Path(staging) / ONNX_FILE
            with step("Converting a copy to fp16 (LayerNorm and softmax kept in fp32)"):
                _to_fp16(onnx_path, source, options.external_data)
        with step(
            f"Building the {options.served_dtype} TensorRT engine, {tensorrt.describe_profile(profile)}"
        ):
            version = tensorrt.build_engine(source, plan_path, profile)
    with step("Running the engine on a sample batch"):
        actual = tensorrt.EngineRunner(plan_path).run({n: sample[n] for n in graph.inputs})
    checked = agreement_report(
        "TensorRT",
        actual,
        expected,
        sample[contract.ATTENTION_MASK],
        graph.outputs,
        prefix="tensorrt ",
    )
    run.engine = TensorRTEngine(tensorrt.ENGINE_FILE, options.served_dtype, version, profile)
    described = f"TensorRT {version}, {options.served_dtype}, {tensorrt.describe_profile(profile)}"
    run.add_figures(
        {**checked.figures, "tensorrt engine": described},
        checked.ok,
        f"{run.report.heading}; {checked.heading}",
    )


def _pack(run: ExportRun) -> None:
    """The packed graph beside an ONNX export that asks for one (`ExportOptions.pack`), and whether
    it was checked against the unpacked graph, or the report's line saying why there is none. Its
    ops run on CUDA only: checked here where onnxruntime's CUDA provider runs, and in any case by the
    encode stage when it loads (`packing`). A packed graph that disagrees is not kept."""
    graph, options, step = run.graph, run.options, run.step
    target = options.out / packing.PACKED_FILE
    target.unlink(missing_ok=True)  # a previous export's, into the same directory
    wanted = options.pack if options.pack is not None else graph.dtype == "fp16"
    if not wanted or options.format is not ExportFormat.ONNX or not run.report.ok:
        return
    pad_id = int(run.tokenizer.pad_token_id or 0)
    if graph.dtype == "int8":
        reason: str | None = "int8 graphs are for CPUs; packing is for onnxruntime's CUDA provider"
    elif run.late_interaction is not None:
        reason = "a late-interaction query holds tokens no token attends to, which packing drops"
    elif not graph.fused_ops:
        reason = "the graph has no fused ops to pack (exported with --no-fuse-ops, or none matched)"
    else:
        with step("Writing the packed graph (padding removed inside the encoder, for CUDA)"):
            reason = packing.write_packed_graph(options.out / ONNX_FILE, target)
    checked = False
    if reason is None and packing.cuda_available():
        with step("Checking the packed graph against the unpacked one on CUDA"):
            reason = packing.check_on_cuda(options.out / ONNX_FILE, target, graph, pad_id)
        checked = reason is None
        if reason:
            target.unlink()
    where = "agrees on CUDA" if checked else "checked on CUDA when the encode stage loads it"
    run.add_figures(
        {PACKED_FIGURE: f"none: {reason}" if reason else f"{packing.PACKED_FILE} ({where})"}
    )
    run.packed_file, run.packed_checked = (None if reason else packing.PACKED_FILE), checked


def _calibrate(run: ExportRun, manifest: Manifest) -> None:
    """calibration.json for a dense export whose graph passed its check, when asked or cheap; the
    report's line says how it was made, or why there is none."""
    options = run.options
    if not run.report.ok:
        run.add_figures({calibration.FIGURE: "skipped: the graph failed its check"})
        return
    skipped = calibration.skip_reason(
        options.calibrate, calibration.graph_parameters(options.out / manifest.onnx_file)
    )
    if skipped:
        run.add_figures({calibration.FIGURE: skipped})
        return
    with run.step(f"Calibrating int8 embedding ranges on {calibration.CORPUS_TEXTS} texts"):
        try:
            result = calibration.calibrate(options.out, manifest, run.tokenizer)
        except calibration.CalibrationUnavailable as exc:
            run.add_figures({calibration.FIGURE: f"skipped: {exc}"})
            return
        manifest.calibration_file = calibration.write_calibration(options.out, result, manifest)
        run.add_figures({calibration.FIGURE: calibration.describe(result)})


def assemble_manifest(run: ExportRun) -> Manifest:
    """What the export tells Triton's stages and the gateway about the graph it wrote: read from the
    source's configs, the plan, the graph and the engine; `prompts` are the source's, with the
    default one's name (`read_prompts`)."""
    source, config, tokenizer = run.source, run.config, run.tokenizer
    plan, graph, prompts = run.plan, run.graph, run.prompts
    dense_source = contract.SENTENCE_EMBEDDING if plan.graph_pooling else contract.LAST_HIDDEN_STATE
    hidden = next((o.dims[-1] for o in graph.outputs if o.name == dense_source), None)
    labels = {int(k): v for k, v in (config.get("id2label") or {}).items()}
    return Manifest(
        task=plan.task,
        source=source.name,
        revision=source.revision,
        max_length=plan.max_length,
        onnx_file=ONNX_FILE,
        dtype=graph.dtype,
        inputs=graph.inputs,
        outputs=graph.outputs,
        pad_id=int(tokenizer.pad_token_id or 0),
        special_ids=special_ids(tokenizer),
        pooling=plan.pooling,
        graph_pooling=plan.graph_pooling,
        normalize=plan.normalize,
        dim=hidden if plan.kind.dense else None,
        id2label=labels if plan.kind.named_labels else {},
        attention_heads=_attention_heads(config),
        pair_template=plan.template,
        pair_truncation=run.options.pair_truncation,
        packed_file=run.packed_file,
        packed_checked=run.packed_checked,
        tensorrt=run.engine,
        fused_ops=graph.fused_ops,
        prompts=prompts[0],
        default_prompt_name=prompts[1],
        include_prompt=plan.layout.include_prompt if plan.layout else True,
        matryoshka_dimensions=read_matryoshka(source, config) if plan.kind.dense else None,
        late_interaction=run.late_interaction,
        strip_texts=plan.strip_texts,
    )


def _late_interaction(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    options: ExportOptions,
    adopted: GraphInfo | None,
) -> LateInteraction | None:
    """A late-interaction model's token ids, or None for other models; what prensa cannot serve as
    PyLate does is refused here, before the export's work."""
    if plan.late is None:
        return None
    refusal = (
        f"{ONNX_FILE} beside it cannot be told which tokens a query expands"
        if adopted
        else "int8 is not checked against PyLate"
        if options.quantize_int8
        else "its TensorRT engine is not built"
        if options.format is ExportFormat.TENSORRT
        else None
    )
    if refusal:
        raise SourceError(
            f"{source.name} is a late-interaction model: {refusal}; export it from its weights to "
            "ONNX fp32 or fp16"
        )
    return interaction(plan.late, tokenizer, source.name)


def export_model(
    options: ExportOptions, step: Step = _no_progress
) -> tuple[Manifest, VerifyReport]:
    from transformers import AutoTokenizer

    if options.format is ExportFormat.TENSORRT:
        from prensa.export.tensorrt import require_tensorrt

        require_tensorrt()  # before minutes of export work
    with step("Locating model files"):
        source = resolve_source(options.source, options.revision)
        config = _read_config(source)
        own = read_own_files(source)
        if own is None:  # read from its own files, it runs no transformers code to check
            require_native_code(source, config)
        if not source.has(ONNX_FILE):  # an adopted graph is not loaded into torch
            require_memory(source, config, psutil.virtual_memory().available)
        # transformers leaves from_pretrained unannotated; there is no typed way to call it.
        tokenizer = (
            own.tokenizer()
            if own is not None
            else AutoTokenizer.from_pretrained(source.path, use_fast=True, trust_remote_code=False)  # type: ignore[no-untyped-call]
        )
        if not tokenizer.is_fast:
            raise SourceError(
                f"{source.name} has no fast (Rust) tokenizer; prensa's tokenize stage needs tokenizer.json"
            )
        if lowercases(source):  # sentence-transformers' `do_lower_case`, kept in the tokenizer file
            lowercase_first(tokenizer)
        prompts = read_prompts(source)
        adopted = describe_graph(source.path / ONNX_FILE) if source.has(ONNX_FILE) else None
        task = options.task or (task_from_outputs(adopted, config) if adopted else None)
        plan = _plan(source, tokenizer, config, options, task, prompts[0])
        _check_pair_truncation(source, plan, options.pair_truncation)
        late_interaction = _late_interaction(source, tokenizer, plan, options, adopted)
    options.out.mkdir(parents=True, exist_ok=True)
    remove_staging(options.out)  # what an export killed midway left: gigabytes for a large model
    if adopted:
        adopted.require(plan.task)
        if plan.layout is not None and not plan.layout.include_prompt:
            raise SourceError(
                f"{source.name}: its pooling leaves prompt tokens out (include_prompt: false), which "
                f"{ONNX_FILE} cannot be told; export it from its weights instead of adopting the graph"
            )
        if plan.graph_pooling:
            raise SourceError(
                f"{source.name}: model.onnx outputs hidden states, and its sentence-transformers modules "
                f"({plan.graph_pooling} pooling, {len(plan.layout.dense) if plan.layout else 0} Dense) "
                "would be skipped; export it from its weights instead of adopting the graph"
            )
        graph, report = _adopt_onnx(source, tokenizer, plan, adopted, options, step)
    else:
        onnx_dtype = options.served_dtype if options.format is ExportFormat.ONNX else "fp32"
        fuse = options.fuse_ops and options.format is ExportFormat.ONNX
        graph, report = _export_torch(source, tokenizer, plan, options, onnx_dtype, fuse, step)
    run = ExportRun(
        source, config, tokenizer, plan, options, step, prompts, late_interaction, graph, report
    )
    for applies, then in GRAPH_STEPS:
        if applies(run):
            then(run)
    with step("Writing tokenizer and sentence-transformers configs"):
        tokenizer.save_pretrained(options.out)
        for extra in ST_FILES:
            if source.has(extra):
                (options.out / extra).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source.path / extra, options.out / extra)
    manifest = assemble_manifest(run)
    if late_interaction is not None:
        with step("Framing queries and documents with the model's marker tokens"):
            write_tokenizers(options.out, manifest.tokenizer_file, late_interaction, source.name)
    # a previous export's, into the same directory
    (options.out / CALIBRATION_FILE).unlink(missing_ok=True)
    if of_manifest(manifest).dense:
        _calibrate(run, manifest)
    with step("Writing manifest"):
        manifest.write(options.out)
    return manifest, run.report


# What runs on the written graph, in order, each when it applies.
GRAPH_STEPS: tuple[tuple[Callable[[ExportRun], bool], Callable[[ExportRun], None]], ...] = (
    (lambda run: run.options.quantize_int8, _quantize),
    (lambda run: run.options.format is ExportFormat.TENSORRT, _build_tensorrt),
    (lambda run: True, _pack),  # it says itself why an export has no packed graph
)
