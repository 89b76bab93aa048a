"""Read a model directory and decide how to serve it: task, pooling, normalisation, max length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prensa.export.source import SourceError, SourceModel
from prensa.manifest import Pooling, Task

M3_HEADS = ("sparse_linear.pt", "colbert_linear.pt")
MAX_SANE_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30


@dataclass(frozen=True)
class ModelPlan:
    task: Task
    pooling: Pooling | None
    normalize: bool
    max_length: int


def _read_json(source: SourceModel, relative: str) -> Any:
    """The file's JSON (an object or a list, as json.loads gives it), None when there is no such file."""
    path = source.path / relative
    return json.loads(path.read_text()) if path.exists() else None


def detect_task(source: SourceModel, architectures: list[str]) -> Task:
    if any(source.has(head) for head in M3_HEADS) or "bge-m3" in source.name.lower():
        return Task.M3
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        config: dict[str, Any] = _read_json(source, "config.json") or {}
        return Task.RERANK if len(config.get("id2label", {0: 0})) == 1 else Task.CLASSIFY
    if any(a.endswith("ForMaskedLM") for a in architectures) and not source.has("modules.json"):
        return Task.SPLADE
    return Task.EMBED


def detect_pooling(source: SourceModel) -> Pooling | None:
    config: dict[str, Any] | None = _read_json(source, "1_Pooling/config.json")
    if not config:
        return None
    if config.get("pooling_mode_cls_token"):
        return Pooling.CLS
    if config.get("pooling_mode_mean_tokens"):
        return Pooling.MEAN
    if config.get("pooling_mode_lasttoken"):
        return Pooling.LAST
    raise SourceError(f"{source.name}: 1_Pooling/config.json asks for a pooling prensa does not serve: {config}")


def detect_normalize(source: SourceModel) -> bool:
    modules: list[Any] | None = _read_json(source, "modules.json")
    if modules is None:
        return True  # TEI normalises by default; sentence-transformers configs below say otherwise
    return any(str(m.get("type", "")).endswith("Normalize") for m in modules)


def detect_max_length(source: SourceModel, tokenizer_limit: int | None, position_limit: int | None) -> int:
    st_config: dict[str, Any] = _read_json(source, "sentence_bert_config.json") or {}
    if st_config.get("max_seq_length"):
        return int(st_config["max_seq_length"])
    if tokenizer_limit and tokenizer_limit < MAX_SANE_LENGTH:
        return int(tokenizer_limit)
    if position_limit:
        return int(position_limit)
    return 512


def plan_model(source: SourceModel, architectures: list[str], requested_task: Task | None,
               pooling: Pooling | None, max_length: int | None, dense_only: bool,
               tokenizer_limit: int | None, position_limit: int | None) -> ModelPlan:
    task = requested_task or detect_task(source, architectures)
    if task is Task.M3 and dense_only:
        return ModelPlan(Task.EMBED, Pooling.CLS, True, max_length or detect_max_length(source, tokenizer_limit, position_limit))
    if task is Task.M3:
        missing = [head for head in M3_HEADS if not source.has(head)]
        if missing:
            raise SourceError(
                f"{source.name} is a bge-m3 model but {', '.join(missing)} is missing from {source.path}; "
                "prensa never serves randomly initialised heads. Add the file, or pass --dense-only."
            )
    if task in (Task.EMBED, Task.M3):
        pooling = pooling or (Pooling.CLS if task is Task.M3 else detect_pooling(source) or Pooling.CLS)
    else:
        pooling = None
    normalize = True if task is Task.M3 else detect_normalize(source)
    length = max_length or detect_max_length(source, tokenizer_limit, position_limit)
    return ModelPlan(task, pooling, normalize, length)
