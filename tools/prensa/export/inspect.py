"""Read a model directory and decide how to serve it: task, pooling, normalisation, max length."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prensa import layouts
from prensa.export import llm_reranker
from prensa.export.late import STANFORD_ARCHITECTURE as STANFORD
from prensa.export.late import LateLayout, read_late_layout
from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import MODULES_FILE, SentenceLayout, read_layout
from prensa.layouts import (
    CLASSIFIER,
    CROSS_ENCODER,
    EMBEDDER,
    LATE,
    LLM_RERANKER,
    M3,
    SPLADE,
    Layout,
    ModelFiles,
    m3,
    static,
)
from prensa.layouts import llm_reranker as llm_reranker_layout
from prensa.manifest import GraphOutput, Pooling, Task

if TYPE_CHECKING:
    import numpy.typing as npt
    from torch import nn
    from transformers import PreTrainedTokenizerFast

MAX_SANE_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30
DEFAULT_LENGTH = 512  # a model that states no length of its own
# sentence-transformers' pooling modes the pool stage computes itself.
STAGE_POOLING = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST}


class OwnFiles(Protocol):
    """A model whose own files say what it is, with no transformers config to read (a static
    embedding model: a table and a tokenizer). Its layout module reads it (`OWN_FILES`), and the
    export plans, tokenizes, traces and checks it through this rather than through transformers."""

    @property
    def library(self) -> str:
        """Whose reading is served: the export report's reference line."""

    @property
    def normalize(self) -> bool: ...

    @property
    def max_length(self) -> int | None:
        """Where its library cuts a text; None where it never does."""

    @property
    def serves(self) -> Layout: ...

    @property
    def described(self) -> str:
        """What it is and serves, for the line that refuses another --task."""

    @property
    def graph_pooling(self) -> str: ...

    def tokenizer(self) -> PreTrainedTokenizerFast: ...

    def graph(self) -> tuple[nn.Module, list[GraphOutput]]: ...

    def reference(self, source: SourceModel, texts: list[str]) -> npt.NDArray[Any]: ...


# The layouts that read a model's own files, asked before anything reads transformers' config.
OWN_FILES: tuple[Callable[[SourceModel], OwnFiles | None], ...] = (static.read_static,)


def read_own_files(source: SourceModel) -> OwnFiles | None:
    """The model as the first layout in `OWN_FILES` that knows its files reads it, if one does."""
    return next((own for read in OWN_FILES if (own := read(source)) is not None), None)


@dataclass(frozen=True)
class ModelPlan:
    task: Task
    pooling: Pooling | None
    normalize: bool
    max_length: int
    # sentence-transformers' modules, for embedders and SPLADE that have them
    layout: SentenceLayout | None = None
    # an LLM reranker's prompt (Qwen3-Reranker; the tokenize stage's PairTemplate)
    template: dict[str, str] | None = None
    # Put before each text by the export's check of an embedder whose pooling leaves prompts out
    # (`include_prompt: false`), so that the check covers how prensa marks them.
    verify_prompt: str | None = None
    # a late-interaction model's projections and framing (PyLate, HF_ColBERT)
    late: LateLayout | None = None
    # the reference library strips each text before tokenizing (`contract.STRIP_TEXTS`)
    strip_texts: bool = False
    # a model read from its own files (`OWN_FILES`: a static embedding model's table)
    own: OwnFiles | None = None

    @property
    def kind(self) -> Layout:
        """The layout it is served as (`layout` is its sentence-transformers modules)."""
        return layouts.resolve(self.task, prompted_pairs=self.template is not None)

    @property
    def graph_pooling(self) -> str | None:
        """The pooling modes the graph runs itself (sentence-transformers' modules traced into it,
        a static model's mean of its rows)."""
        if self.own is not None:
            return self.own.graph_pooling
        if self.kind is not EMBEDDER or self.layout is None or self.layout.simple_pooling:
            return None
        return "+".join(self.layout.pooling_modes)


# checked when the model names no prompt: the gateway's --default-prompt may add one
STAND_IN_PROMPT = "query: "


def _read_json(source: SourceModel, relative: str) -> Any:
    """The file's JSON (an object or a list, as json.loads gives it), None when there is no such file."""
    path = source.path / relative
    return json.loads(path.read_text()) if path.exists() else None


def detect_layout(
    source: SourceModel, architectures: list[str], layout: SentenceLayout | None, labels: int
) -> Layout:
    """The layout that claims the model's files (`layouts.detect`); `labels`: the head's outputs
    its config names."""
    files = ModelFiles(
        name=source.name,
        architectures=tuple(architectures),
        labels=labels,
        has=source.has,
        sentence_modules=layout is not None,
        sentence_splade=layout is not None and layout.is_splade,
    )
    return layouts.detect(files)


def require_native_code(source: SourceModel, config: dict[str, Any]) -> None:
    """A model transformers builds with its own code passes; one that needs the model's code
    (`auto_map`), or whose type this transformers does not know, is refused by name."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not model_type or model_type in CONFIG_MAPPING:
        return
    if config.get("auto_map"):
        raise SourceError(
            f"{source.name} needs its own Python code (model type {model_type!r}, auto_map in "
            "config.json): prensa never runs a model's code. Export it to ONNX with its authors' "
            "tooling and pass that directory (prensa adopts a model.onnx beside its tokenizer)"
        )
    raise SourceError(
        f"{source.name}: transformers {transformers.__version__} does not know model type "
        f"{model_type!r}, so prensa cannot trace it; export it to ONNX yourself and pass that directory"
    )


# An export holds the model in fp32 about this many times over at its peak: torch's weights and the
# traced graph at once (measured on bge-m3 and Qwen3-Embedding's shapes: docs/performance.md).
EXPORT_PEAK_FACTOR = 2.8
# a folder's weights in the first format it has
WEIGHT_FORMATS = (
    "*.safetensors",
    "pytorch_model*.bin",
)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def stored_weight_bytes(directory: Path) -> int:
    """The weights in `directory` and its module folders (`2_Dense/`, ...), one format per folder."""
    total = 0
    for folder in (directory, *(p for p in directory.rglob("*") if p.is_dir())):
        for pattern in WEIGHT_FORMATS:
            files = list(folder.glob(pattern))
            if files:
                total += sum(path.stat().st_size for path in files)
                break
    return total


def export_peak_bytes(source: SourceModel, config: dict[str, Any]) -> int:
    """What exporting the model will hold at its peak: its weights as fp32, times EXPORT_PEAK_FACTOR."""
    stored = stored_weight_bytes(source.path)
    per_weight = DTYPE_BYTES.get(
        str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4
    )
    return int(stored / per_weight * 4 * EXPORT_PEAK_FACTOR)


def require_memory(source: SourceModel, config: dict[str, Any], available: int) -> None:
    """Refuse, before minutes of work, a model whose export cannot fit this machine's free memory."""
    needed = export_peak_bytes(source, config)
    if needed > available:
        raise SourceError(
            f"{source.name}: exporting it takes about {needed / 2**30:.0f} GiB of memory (its weights "
            f"in fp32, {EXPORT_PEAK_FACTOR}x at the peak) and this machine has {available / 2**30:.0f} GiB "
            "free: export it on a larger machine and copy the export here"
        )


def causal_lm(architectures: list[str]) -> bool:
    return any(a.endswith("ForCausalLM") for a in architectures)


def detect_max_length(
    source: SourceModel, tokenizer_limit: int | None, position_limit: int | None
) -> int:
    """sentence-transformers' `max_seq_length`, else the tokenizer's limit, within the model's positions."""
    st_config: dict[str, Any] = _read_json(source, "sentence_bert_config.json") or {}
    if st_config.get("max_seq_length"):
        length = int(st_config["max_seq_length"])
    elif tokenizer_limit and tokenizer_limit < MAX_SANE_LENGTH:
        length = int(tokenizer_limit)
    else:
        length = int(position_limit or DEFAULT_LENGTH)
    return min(length, position_limit) if position_limit else length


def _embedding_pooling(
    source: SourceModel, layout: SentenceLayout | None, requested: Pooling | None, decoder: bool
) -> Pooling | None:
    """The pool stage's pooling: asked for, the sentence-transformers config's, else cls (a decoder's
    last token, as sentence-transformers pools one without a config); None when the graph pools
    (its modules cannot be overridden)."""
    if layout is None:
        return requested or (Pooling.LAST if decoder else Pooling.CLS)
    if layout.simple_pooling is None:
        if requested:
            raise SourceError(
                f"{source.name} pools with its own sentence-transformers modules "
                f"({'+'.join(layout.pooling_modes)}, {len(layout.dense)} Dense layers), which prensa "
                "runs inside the graph: --pooling cannot replace them"
            )
        return None
    return requested or STAGE_POOLING[layout.simple_pooling]


def _late_plan(
    source: SourceModel,
    late: LateLayout | None,
    requested_task: Task | None,
    max_length: int | None,
    position_limit: int | None,
) -> ModelPlan:
    """A late-interaction model's plan: documents cut at its document length (or `max_length`)."""
    if late is None:
        raise SourceError(
            f"{source.name}: --task late serves PyLate directories and {STANFORD} checkpoints, and "
            "this is neither"
        )
    if requested_task not in (None, LATE.task):
        raise SourceError(
            f"{source.name} is a late-interaction model (PyLate or ColBERT); export it as --task late"
        )
    length = max_length or late.document_length
    if position_limit and length > position_limit:
        raise SourceError(
            f"{source.name}: its documents take {length} tokens and its transformer has "
            f"{position_limit} positions"
        )
    if late.query_length > length:
        raise SourceError(
            f"{source.name}: its queries take {late.query_length} tokens, more than the "
            f"{length} served as its max length"
        )
    # PyLate reads texts through sentence-transformers 5.3's Transformer.tokenize, which strips them
    return ModelPlan(LATE.task, None, True, length, late=late, strip_texts=True)


def _own_plan(
    source: SourceModel,
    own: OwnFiles,
    requested_task: Task | None,
    pooling: Pooling | None,
    max_length: int | None,
) -> ModelPlan:
    """The plan of a model read from its own files: what it serves, cut where its library cuts (or
    at `max_length`, else the default length: a library that never cuts a text has none)."""
    if requested_task not in (None, own.serves.task) or pooling is not None:
        raise SourceError(f"{source.name} is {own.described}; drop --task and --pooling")
    length = max_length or own.max_length or DEFAULT_LENGTH
    return ModelPlan(own.serves.task, None, own.normalize, length, own=own)


@dataclass(frozen=True)
class Asked:
    """What a layout's plan reads: the model's files as read once, and what the user asked for."""

    source: SourceModel
    architectures: list[str]
    sentence: SentenceLayout | None  # its sentence-transformers modules
    pooling: Pooling | None
    length: int  # asked for, else the model's own
    dense_only: bool
    prompts: dict[str, str] | None


def _m3_plan(asked: Asked) -> ModelPlan:
    """bge-m3 with both head files; with --dense-only, a CLS-pooled embedder."""
    if asked.dense_only:
        return ModelPlan(EMBEDDER.task, Pooling.CLS, True, asked.length)
    missing = [head for head in m3.HEADS if not asked.source.has(head)]
    if missing:
        raise SourceError(
            f"{asked.source.name} is a bge-m3 model but {', '.join(missing)} is missing from "
            f"{asked.source.path}; prensa never serves randomly initialised heads. Add the file, or "
            "pass --dense-only."
        )
    return ModelPlan(M3.task, asked.pooling or Pooling.CLS, True, asked.length)


def _splade_plan(asked: Asked) -> ModelPlan:
    if asked.sentence is not None and not asked.sentence.is_splade:
        raise SourceError(
            f"{asked.source.name}: its {MODULES_FILE} describes a dense embedder, not SPLADE; drop "
            "--task splade"
        )
    normalize = asked.sentence.normalize if asked.sentence else True
    return ModelPlan(SPLADE.task, None, normalize, asked.length, asked.sentence)


def _logits_plan(kind: Layout) -> Callable[[Asked], ModelPlan]:
    """A cross-encoder's or classifier's plan: its logits, nothing pooled."""

    def plan(asked: Asked) -> ModelPlan:
        normalize = asked.sentence.normalize if asked.sentence else True
        return ModelPlan(kind.task, None, normalize, asked.length)

    return plan


def _llm_reranker_plan(asked: Asked) -> ModelPlan:
    return ModelPlan(
        LLM_RERANKER.task, None, True, asked.length, template=llm_reranker.QWEN3_RERANKER
    )


def _embedder_plan(asked: Asked) -> ModelPlan:
    sentence = asked.sentence
    if sentence is not None and sentence.is_splade:
        raise SourceError(
            f"{asked.source.name}: its modules.json describes SPLADE (SpladePooling); export it as "
            "--task splade"
        )
    verify_prompt = None
    # the model's first prompt, or one a server could add
    if sentence is not None and not sentence.include_prompt:
        verify_prompt = next(
            (text for text in (asked.prompts or {}).values() if text), STAND_IN_PROMPT
        )
    decoder = causal_lm(asked.architectures)
    return ModelPlan(
        EMBEDDER.task,
        _embedding_pooling(asked.source, sentence, asked.pooling, decoder),
        sentence.normalize if sentence is not None else True,  # TEI normalises plain models
        asked.length,
        sentence,
        verify_prompt=verify_prompt,
    )


# Each layout's plan (a model read from its own files, or a late-interaction model, is planned
# first, in `plan_model`).
PLANS: dict[Layout, Callable[[Asked], ModelPlan]] = {
    M3: _m3_plan,
    SPLADE: _splade_plan,
    CROSS_ENCODER: _logits_plan(CROSS_ENCODER),
    CLASSIFIER: _logits_plan(CLASSIFIER),
    LLM_RERANKER: _llm_reranker_plan,
    EMBEDDER: _embedder_plan,
}


def _asked_layout(task: Task, sentence: SentenceLayout | None, architectures: list[str]) -> Layout:
    """The layout `--task` names: a reranker asked of a bare Qwen3 causal LM is its LLM reranker."""
    prompted = sentence is None and llm_reranker_layout.known(architectures)
    return layouts.resolve(task, prompted_pairs=prompted and task is LLM_RERANKER.task)


def plan_model(
    source: SourceModel,
    architectures: list[str],
    requested_task: Task | None,
    pooling: Pooling | None,
    max_length: int | None,
    dense_only: bool,
    tokenizer_limit: int | None,
    position_limit: int | None,
    prompts: dict[str, str] | None = None,
    *,
    labels: int,
) -> ModelPlan:
    """What to export of `source`: its layout (asked by `requested_task`, else detected from its
    files, `architectures` and its config's `labels`) and that layout's plan."""
    own = read_own_files(source)
    if own is not None:
        return _own_plan(source, own, requested_task, pooling, max_length)
    late = read_late_layout(source, architectures)
    if late is not None or requested_task is LATE.task:
        return _late_plan(source, late, requested_task, max_length, position_limit)
    sentence = read_layout(source)
    kind = (
        _asked_layout(requested_task, sentence, architectures)
        if requested_task
        else detect_layout(source, architectures, sentence, labels)
    )
    length = max_length or detect_max_length(source, tokenizer_limit, position_limit)
    asked = Asked(source, architectures, sentence, pooling, length, dense_only, prompts)
    return PLANS[kind](asked)
