"""Read a model directory and decide how to serve it: task, pooling, normalisation, max length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prensa import layouts
from prensa.export import llm_reranker
from prensa.export.late import STANFORD_ARCHITECTURE as STANFORD
from prensa.export.late import LateLayout, read_late_layout
from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import MODULES_FILE, SentenceLayout, read_layout
from prensa.layouts import Layout, ModelFiles, m3, static
from prensa.layouts.llm_reranker import ARCHITECTURES as LLM_ARCHITECTURES
from prensa.manifest import Pooling, Task

MAX_SANE_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30
DEFAULT_LENGTH = 512  # a model that states no length of its own
# sentence-transformers' pooling modes the pool stage computes itself.
STAGE_POOLING = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST}


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
    # a static embedding model's table and files (`layouts.static`)
    static: static.StaticLayout | None = None

    @property
    def kind(self) -> Layout:
        """The layout it is served as (`layout` is its sentence-transformers modules)."""
        return layouts.resolve(self.task, prompted_pairs=self.template is not None)

    @property
    def graph_pooling(self) -> str | None:
        """The pooling modes the graph runs itself (sentence-transformers' modules traced into it,
        a static model's mean of its rows)."""
        if self.static is not None:
            return "mean"
        if self.task is not Task.EMBED or self.layout is None or self.layout.simple_pooling:
            return None
        return "+".join(self.layout.pooling_modes)


# checked when the model names no prompt: the gateway's --default-prompt may add one
STAND_IN_PROMPT = "query: "


def _read_json(source: SourceModel, relative: str) -> Any:
    """The file's JSON (an object or a list, as json.loads gives it), None when there is no such file."""
    path = source.path / relative
    return json.loads(path.read_text()) if path.exists() else None


def detect_task(
    source: SourceModel, architectures: list[str], layout: SentenceLayout | None
) -> Task:
    """The task of the layout that claims the model's files (`layouts.detect`)."""
    config: dict[str, Any] = _read_json(source, "config.json") or {}
    files = ModelFiles(
        name=source.name,
        architectures=tuple(architectures),
        labels=len(config.get("id2label", {0: 0})),
        has=source.has,
        sentence_modules=layout is not None,
        sentence_splade=layout is not None and layout.is_splade,
    )
    return layouts.detect(files).task


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


def is_llm_reranker(architectures: list[str]) -> bool:
    return any(a in LLM_ARCHITECTURES for a in architectures)


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
    if requested_task not in (None, Task.LATE):
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
    return ModelPlan(Task.LATE, None, True, length, late=late, strip_texts=True)


def _static_plan(
    source: SourceModel,
    layout: static.StaticLayout,
    requested_task: Task | None,
    pooling: Pooling | None,
    max_length: int | None,
) -> ModelPlan:
    """A static embedding model's plan: its mean, cut where its tokenizer file cuts (or at
    `max_length`, else the default length: the library itself never cuts a text without one)."""
    if requested_task not in (None, static.LAYOUT.task) or pooling is not None:
        raise SourceError(
            f"{source.name} is a static embedding model: it serves the mean of its "
            "token rows as dense embeddings; drop --task and --pooling"
        )
    length = max_length or layout.max_length or DEFAULT_LENGTH
    return ModelPlan(static.LAYOUT.task, None, layout.normalize, length, static=layout)


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
) -> ModelPlan:
    static_layout = static.read_static(source)
    if static_layout is not None:
        return _static_plan(source, static_layout, requested_task, pooling, max_length)
    late = read_late_layout(source, architectures)
    if late is not None or requested_task is Task.LATE:
        return _late_plan(source, late, requested_task, max_length, position_limit)
    layout = read_layout(source)
    task = requested_task or detect_task(source, architectures, layout)
    length = max_length or detect_max_length(source, tokenizer_limit, position_limit)
    if task is Task.M3 and dense_only:
        return ModelPlan(Task.EMBED, Pooling.CLS, True, length)
    if task is Task.M3:
        missing = [head for head in m3.HEADS if not source.has(head)]
        if missing:
            raise SourceError(
                f"{source.name} is a bge-m3 model but {', '.join(missing)} is missing from {source.path}; "
                "prensa never serves randomly initialised heads. Add the file, or pass --dense-only."
            )
        return ModelPlan(task, pooling or Pooling.CLS, True, length)
    if task is Task.SPLADE and layout is not None and not layout.is_splade:
        raise SourceError(
            f"{source.name}: its {MODULES_FILE} describes a dense embedder, not SPLADE; drop --task splade"
        )
    if task is Task.EMBED and layout is not None and layout.is_splade:
        raise SourceError(
            f"{source.name}: its modules.json describes SPLADE (SpladePooling); export it as --task splade"
        )
    if task is Task.RERANK and layout is None and is_llm_reranker(architectures):
        return ModelPlan(task, None, True, length, None, llm_reranker.QWEN3_RERANKER)
    if task is not Task.EMBED:
        return ModelPlan(
            task,
            None,
            layout.normalize if layout else True,
            length,
            layout if task is Task.SPLADE else None,
        )
    # TEI normalises plain models by default
    normalize = layout.normalize if layout is not None else True
    verify_prompt = None
    # the model's first prompt, or one a server could add
    if layout is not None and not layout.include_prompt:
        verify_prompt = next((text for text in (prompts or {}).values() if text), STAND_IN_PROMPT)
    return ModelPlan(
        task,
        _embedding_pooling(source, layout, pooling, causal_lm(architectures)),
        normalize,
        length,
        layout,
        verify_prompt=verify_prompt,
    )
