"""The kinds of model prensa serves, one module each, and the one place a model's kind is resolved.

A new layout is a module here and a row in `LAYOUTS`; the gateway reads what it serves from the
`Layout`, not from switches on `Task`."""

from __future__ import annotations

from prensa.layouts.base import Capability, Layout, ModelType, PairInput, Scoring
from prensa.layouts.classifier import CLASSIFIER
from prensa.layouts.cross_encoder import CROSS_ENCODER
from prensa.layouts.embedder import EMBEDDER
from prensa.layouts.late import LATE
from prensa.layouts.llm_reranker import LLM_RERANKER
from prensa.layouts.m3 import M3
from prensa.layouts.splade import SPLADE
from prensa.manifest import Manifest, Task

LAYOUTS: tuple[Layout, ...] = (EMBEDDER, M3, SPLADE, LATE, CROSS_ENCODER, LLM_RERANKER, CLASSIFIER)


def resolve(task: Task, *, prompted_pairs: bool = False) -> Layout:
    """The layout of a served model: its task, and for a reranker whether its pairs are written into
    a prompt (an LLM reranker's ensemble carries the template)."""
    for layout in LAYOUTS:
        if layout.task is task and layout.prompted_pairs == prompted_pairs:
            return layout
    raise ValueError(f"no layout serves task {task} with prompted_pairs={prompted_pairs}")


def of_manifest(manifest: Manifest) -> Layout:
    """The layout of an export, as its manifest says."""
    return resolve(manifest.task, prompted_pairs=manifest.pair_template is not None)


__all__ = [
    "LAYOUTS",
    "Capability",
    "Layout",
    "ModelType",
    "PairInput",
    "Scoring",
    "of_manifest",
    "resolve",
]
