"""Static embedding models: sentence-transformers' `StaticEmbedding` (static-retrieval-mrl-en-v1,
static-similarity-mrl-multilingual-v1) and model2vec's `StaticModel` (potion-base-8M,
potion-retrieval-32M), a token embedding table whose rows are averaged over a text's tokens.

Served as a pooled embedder (`EMBEDDER`): the graph looks the rows up and averages them over the
attention mask, and the pool stage only normalises. Each is read as its own library reads it, both
without special tokens (the export writes a tokenizer file that adds none, so the tokenize stage
and the gateway read texts alike):
- sentence-transformers' `StaticEmbedding.preprocess` keeps `[UNK]` and cuts only where
  `tokenizer.json` says so; a `Normalize` module may follow.
- model2vec's `encode` leaves its unknown token out of the mean, weighs each row by the file's
  `weights` and finds it through its `mapping` (a quantized vocabulary), and normalises where
  `config.json` says; it cuts at 512 tokens unless told otherwise. The tokenize stage cuts where
  model2vec does only for texts that fit (a longer text, cut, may keep other tokens than model2vec
  keeps: it drops unknown tokens before its cut and shortens the text by characters first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import MODULES_FILE, class_name
from prensa.layouts.base import Layout
from prensa.layouts.embedder import EMBEDDER
from prensa.manifest import GraphOutput
from prensa.stages import contract

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerFast

LAYOUT = EMBEDDER  # what the gateway serves: pooled dense vectors
MODULE = "StaticEmbedding"
SENTENCE_TRANSFORMERS_KEY = "embedding.weight"
MODEL2VEC_KEYS = ("embeddings", "weights", "mapping")  # the table, each token's weight, its row
MODEL2VEC_MAX_LENGTH = 512  # `StaticModel.encode`'s default cut
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"
SERVED = "StaticEmbedding -> Normalize (optional)"
SENTENCE_TRANSFORMERS = "sentence-transformers"  # whose reading is served, and the report's line
MODEL2VEC = "model2vec"


@dataclass(frozen=True)
class StaticLayout:
    """Where a static model keeps its files, and how its library reads them: the export plans,
    tokenizes, traces and checks it through this (`export.inspect.OwnFiles`)."""

    folder: Path  # the model's root (sentence-transformers 5, model2vec) or 0_StaticEmbedding/
    library: str  # `SENTENCE_TRANSFORMERS` or `MODEL2VEC`
    normalize: bool  # a Normalize module follows, or model2vec's config says so
    max_length: int | None  # where the library cuts a text; None where it never does
    serves: ClassVar[Layout] = LAYOUT
    described: ClassVar[str] = (
        "a static embedding model: it serves the mean of its token rows as dense embeddings"
    )
    graph_pooling: ClassVar[str] = "mean"  # the graph averages the rows itself

    def tokenizer(self) -> PreTrainedTokenizerFast:
        return tokenizer(self)

    def graph(self) -> tuple[nn.Module, list[GraphOutput]]:
        return graph(self)

    def reference(self, source: SourceModel, texts: list[str]) -> npt.NDArray[Any]:
        return reference(source, self, texts)


def read_static(source: SourceModel) -> StaticLayout | None:
    """The directory's static model, None when it is none: a `StaticEmbedding` first in
    `modules.json`, or model2vec's files; a module after it other than Normalize is refused by name."""
    config = json.loads((source.path / CONFIG_FILE).read_text()) if source.has(CONFIG_FILE) else {}
    if not source.has(MODULES_FILE):
        # model2vec's files without sentence-transformers' modules (its older versions)
        return (
            _model2vec(source, source.path, config)
            if config.get("model_type") == MODEL2VEC
            else None
        )
    entries = json.loads((source.path / MODULES_FILE).read_text())
    if not isinstance(entries, list) or not entries:
        return None
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    if class_name(str(entries[0].get("type", ""))) != MODULE:
        return None
    after = [class_name(str(e.get("type", ""))) for e in entries[1:]]
    if after not in ([], ["Normalize"]):
        raise SourceError(
            f"{source.name}: {MODULES_FILE} follows its StaticEmbedding with {' -> '.join(after)}; "
            f"prensa serves {SERVED}"
        )
    folder = (source.path / str(entries[0].get("path") or "")).resolve()
    _require_files(source, folder)
    if MODEL2VEC_KEYS[0] in _keys(folder):  # model2vec's table: its library reads it
        return _model2vec(source, folder, config)
    truncation = json.loads((folder / TOKENIZER_FILE).read_text()).get("truncation") or {}
    cut = truncation.get("max_length")
    return StaticLayout(
        folder, SENTENCE_TRANSFORMERS, after == ["Normalize"], int(cut) if cut else None
    )


def _model2vec(source: SourceModel, folder: Path, config: dict[str, Any]) -> StaticLayout:
    _require_files(source, folder)
    length = config.get("max_length", MODEL2VEC_MAX_LENGTH)
    return StaticLayout(
        folder, MODEL2VEC, bool(config.get("normalize", False)), int(length) if length else None
    )


def _require_files(source: SourceModel, folder: Path) -> None:
    for needed in (TOKENIZER_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise SourceError(f"{source.name}: its static model has no {needed} in {folder}")


def _keys(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / WEIGHTS_FILE), framework="numpy") as weights:
        return set(weights.keys())


def table(layout: StaticLayout) -> npt.NDArray[np.float32]:
    """Each token id's row, [vocabulary, dim]: sentence-transformers' table as it is; model2vec's
    found through its `mapping` and weighed by its `weights` (as `StaticModel` computes a row)."""
    from safetensors.numpy import load_file

    weights = load_file(str(layout.folder / WEIGHTS_FILE))
    if layout.library == SENTENCE_TRANSFORMERS:
        if SENTENCE_TRANSFORMERS_KEY not in weights:
            raise SourceError(
                f"{layout.folder / WEIGHTS_FILE} holds {', '.join(sorted(weights))}, not a "
                f"StaticEmbedding table ({SENTENCE_TRANSFORMERS_KEY})"
            )
        return np.asarray(weights[SENTENCE_TRANSFORMERS_KEY], dtype=np.float32)
    key, per_token, mapping = MODEL2VEC_KEYS
    rows = np.asarray(weights[key], dtype=np.float32)
    if mapping in weights:
        rows = rows[np.asarray(weights[mapping], dtype=np.int64)]
    if per_token in weights:
        rows = rows * np.asarray(weights[per_token], dtype=np.float32)[:, None]
    return rows


def unknown_id(layout: StaticLayout) -> int | None:
    """The token model2vec leaves out of the mean (its tokenizer model's unknown token); None for
    sentence-transformers, which keeps it."""
    if layout.library != MODEL2VEC:
        return None
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(layout.folder / TOKENIZER_FILE))
    unk = getattr(backend.model, "unk_token", None)  # as model2vec asks (a Unigram model has none)
    return backend.token_to_id(unk) if unk else None


def tokenizer(layout: StaticLayout) -> PreTrainedTokenizerFast:
    """The model's tokenizer as the export writes it: no special tokens added (its post-processor
    frames a text as itself), no cut or padding of its own (the stages apply the export's)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(layout.folder / TOKENIZER_FILE))
    backend.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    backend.no_truncation()
    padding = backend.padding or {}
    backend.no_padding()
    pad = padding.get("pad_token") or next(
        (t for t in ("[PAD]", "<pad>") if backend.token_to_id(t) is not None), None
    )
    unk = next((t for t in ("[UNK]", "<unk>") if backend.token_to_id(t) is not None), None)
    # transformers leaves the constructor unannotated
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        pad_token=pad,
        unk_token=unk,
        model_input_names=[contract.INPUT_IDS, contract.ATTENTION_MASK],
    )


def graph(layout: StaticLayout) -> tuple[nn.Module, list[GraphOutput]]:
    """The module to trace: the rows of a text's tokens, averaged over its attention mask (and,
    for model2vec, over its known tokens)."""
    import torch

    class StaticGraph(torch.nn.Module):
        def __init__(self, rows: npt.NDArray[np.float32], unknown: int | None) -> None:
            super().__init__()
            count, dim = rows.shape
            self.embedding = torch.nn.Embedding(count, dim, _weight=torch.from_numpy(rows))
            self.embedding.weight.requires_grad_(False)
            self.unknown = unknown

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            kept = (
                attention_mask
                if self.unknown is None
                else attention_mask * (input_ids != self.unknown)
            )
            mask = kept.unsqueeze(-1).to(self.embedding.weight.dtype)
            summed = (self.embedding(input_ids) * mask).sum(dim=1)
            # an empty text is a zero vector, as EmbeddingBag's mean of an empty bag
            mean: torch.Tensor = summed / mask.sum(dim=1).clamp(min=1.0)
            return mean

    rows = table(layout)
    module = StaticGraph(rows, unknown_id(layout))
    return module, [GraphOutput(contract.SENTENCE_EMBEDDING, [rows.shape[1]], False)]


def reference(source: SourceModel, layout: StaticLayout, texts: list[str]) -> npt.NDArray[Any]:
    """The model's own library's vectors of `texts`: sentence-transformers' `encode`, or model2vec's."""
    if layout.library == MODEL2VEC:
        from model2vec import StaticModel

        return np.asarray(
            StaticModel.from_pretrained(str(layout.folder)).encode(texts), dtype=np.float32
        )
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(source.path), device="cpu")
    return np.asarray(model.encode(texts, batch_size=len(texts)), dtype=np.float32)
