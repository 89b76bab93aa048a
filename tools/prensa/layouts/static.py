"""Static embedding models: sentence-transformers' `StaticEmbedding` (static-retrieval-mrl-en-v1,
static-similarity-mrl-multilingual-v1, a model2vec table loaded into it), a token embedding table
whose rows are averaged over a text's tokens.

Served as a pooled embedder (`EMBEDDER`): the graph looks the rows up and averages them over the
attention mask, and the pool stage only normalises where a `Normalize` module follows. The reading
is the library's: `StaticEmbedding.preprocess` encodes without special tokens, keeps `[UNK]`, and
cuts only where `tokenizer.json` says so; the export writes a tokenizer file that adds no special
tokens, so the tokenize stage and the gateway read texts as the library does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import MODULES_FILE, class_name
from prensa.layouts.embedder import EMBEDDER
from prensa.manifest import GraphOutput
from prensa.stages import contract

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerFast

LAYOUT = EMBEDDER  # what the gateway serves: pooled dense vectors
MODULE = "StaticEmbedding"
# the table's key: sentence-transformers' own, and model2vec's (which `StaticEmbedding.load` also reads)
WEIGHT_KEYS = ("embedding.weight", "embeddings")
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
SERVED = "StaticEmbedding -> Normalize (optional)"
FIGURE = "sentence-transformers"  # the report's line for the reference check


@dataclass(frozen=True)
class StaticLayout:
    """Where a `StaticEmbedding` keeps its files, and what follows it."""

    folder: (
        Path  # the model's root (sentence-transformers 5) or its module folder (0_StaticEmbedding/)
    )
    normalize: bool  # a Normalize module follows
    max_length: int | None  # the tokenizer file's own cut; None where it has none


def read_static(source: SourceModel) -> StaticLayout | None:
    """The directory's `StaticEmbedding`, None when its first module is another; a module after it
    other than Normalize is refused by name."""
    if not source.has(MODULES_FILE):
        return None
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
    folder = source.path / str(entries[0].get("path") or "")
    for needed in (TOKENIZER_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise SourceError(f"{source.name}: its StaticEmbedding has no {needed} in {folder}")
    truncation = json.loads((folder / TOKENIZER_FILE).read_text()).get("truncation") or {}
    cut = truncation.get("max_length")
    return StaticLayout(folder, after == ["Normalize"], int(cut) if cut else None)


def table(layout: StaticLayout) -> npt.NDArray[np.float32]:
    """The embedding table, [vocabulary, dim], under whichever key the file uses."""
    from safetensors.numpy import load_file

    weights = load_file(str(layout.folder / WEIGHTS_FILE))
    key = next((k for k in WEIGHT_KEYS if k in weights), None)
    if key is None:
        raise SourceError(
            f"{layout.folder / WEIGHTS_FILE} holds {', '.join(sorted(weights))}, not a StaticEmbedding "
            f"table ({' or '.join(WEIGHT_KEYS)})"
        )
    return np.asarray(weights[key], dtype=np.float32)


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
    """The module to trace: the table's rows of a text's tokens, averaged over its attention mask."""
    import torch

    class StaticGraph(torch.nn.Module):
        def __init__(self, rows: npt.NDArray[np.float32]) -> None:
            super().__init__()
            count, dim = rows.shape
            self.embedding = torch.nn.Embedding(count, dim, _weight=torch.from_numpy(rows))
            self.embedding.weight.requires_grad_(False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            mask = attention_mask.unsqueeze(-1).to(self.embedding.weight.dtype)
            summed = (self.embedding(input_ids) * mask).sum(dim=1)
            # an empty text is a zero vector, as EmbeddingBag's mean of an empty bag
            mean: torch.Tensor = summed / mask.sum(dim=1).clamp(min=1.0)
            return mean

    rows = table(layout)
    return StaticGraph(rows), [GraphOutput(contract.SENTENCE_EMBEDDING, [rows.shape[1]], False)]


def reference(source: SourceModel, texts: list[str]) -> npt.NDArray[Any]:
    """sentence-transformers' `encode` of `texts` on the model's own directory."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(source.path), device="cpu")
    return np.asarray(model.encode(texts, batch_size=len(texts)), dtype=np.float32)
