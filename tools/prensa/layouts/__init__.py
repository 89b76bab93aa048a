"""The kinds of model prensa serves, one module each, and the one place a model's kind is resolved.

A new layout is a module here and a row in `LAYOUTS`; the gateway reads what it serves from the
`Layout`, not from switches on `Task`, and the export asks each layout in turn whether a model's
files are its own (`detect`)."""

from __future__ import annotations

from prensa.layouts.base import (
    VECTORS,
    Capability,
    Layout,
    ModelFiles,
    ModelType,
    PairInput,
    Scoring,
)
from prensa.layouts.classifier import CLASSIFIER
from prensa.layouts.cross_encoder import CROSS_ENCODER
from prensa.layouts.embedder import EMBEDDER
from prensa.layouts.late import LATE
from prensa.layouts.llm_reranker import LLM_RERANKER
from prensa.layouts.m3 import M3
from prensa.layouts.splade import SPLADE
from prensa.manifest import Manifest, Task

# in the order detection asks them: the most particular files first, a pooled embedder last
LAYOUTS: tuple[Layout, ...] = (M3, CROSS_ENCODER, CLASSIFIER, LLM_RERANKER, SPLADE, LATE, EMBEDDER)


def detect(files: ModelFiles) -> Layout:
    """The layout whose files these are: the first that claims them, else a pooled embedder (what
    any transformer's last hidden states can serve)."""
    return next((one for one in LAYOUTS if one.detect is not None and one.detect(files)), EMBEDDER)


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
    "CLASSIFIER",
    "CROSS_ENCODER",
    "EMBEDDER",
    "LATE",
    "LAYOUTS",
    "LLM_RERANKER",
    "M3",
    "SPLADE",
    "VECTORS",
    "Capability",
    "Layout",
    "ModelFiles",
    "ModelType",
    "PairInput",
    "Scoring",
    "detect",
    "of_manifest",
    "resolve",
]
