"""sentence-transformers models exported from sentence-transformers itself.

The directory is loaded with `SentenceTransformer` (or `SparseEncoder` for SPLADE), so the graph
is traced from the very modules `encode` runs: its transformer, and, where the pool stage cannot
pool alone (Dense layers, max or weighted pooling, several modes at once), its own Pooling and
Dense modules too. The same object answers the reference: what prensa serves is compared with
`encode` on the same directory, so a layout prensa reads wrongly cannot pass its export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from prensa.export.graphs import HiddenStateGraph, SentenceEmbeddingGraph, SpladeGraph
from prensa.export.safe_load import pretrained_options, refusing_pickled_code
from prensa.export.st_layout import SentenceLayout, class_name
from prensa.manifest import GraphOutput
from prensa.stages import contract

FIGURE = "sentence-transformers"  # the export report's line


def load_sentence_model(
    model_dir: Path, layout: SentenceLayout, max_length: int, attn: str = "eager"
) -> Any:
    """`SentenceTransformer` (or `SparseEncoder`) on `model_dir`, on the CPU, never running remote code,
    cutting texts where the export does; its Matryoshka `truncate_dim` is dropped, since prensa serves
    the full vector (and `dimensions`)."""
    from sentence_transformers import SentenceTransformer, SparseEncoder

    kind = SparseEncoder if layout.is_splade else SentenceTransformer
    options = {k: v for k, v in pretrained_options(model_dir).items() if k != "trust_remote_code"}
    with refusing_pickled_code(f"the model weights in {model_dir.name}"):
        model = kind(
            str(model_dir),
            device="cpu",
            trust_remote_code=False,
            model_kwargs={"attn_implementation": attn, **options},
        )
    model.eval()
    model.max_seq_length = max_length
    if hasattr(model, "truncate_dim"):
        model.truncate_dim = None
    return model


def sentence_graph(model: Any, layout: SentenceLayout) -> tuple[Any, list[GraphOutput]]:
    """The module to trace and what it outputs: the transformer's hidden states, and (when the graph
    pools) the modules after it up to Normalize; for SPLADE, the vocabulary weights."""
    transformer = model[0].auto_model
    if layout.is_splade:
        vocab = int(transformer.config.vocab_size)
        splade = SpladeGraph(
            transformer, layout.splade_strategy or "max", layout.splade_activation or "relu"
        )
        return splade, [GraphOutput(contract.SPLADE_WEIGHTS, [vocab], False)]
    hidden = int(transformer.config.hidden_size)
    state = GraphOutput(contract.LAST_HIDDEN_STATE, [-1, hidden], True)
    if layout.simple_pooling:
        graph: HiddenStateGraph | SentenceEmbeddingGraph = HiddenStateGraph(transformer)
        outputs = [state]
    else:
        after = [
            module
            for module in list(model)[1:]
            if class_name(type(module).__name__) in ("Pooling", "Dense")
        ]
        dim = layout.dense[-1].out_features if layout.dense else hidden * len(layout.pooling_modes)
        graph = SentenceEmbeddingGraph(transformer, after)
        outputs = [state, GraphOutput(contract.SENTENCE_EMBEDDING, [dim], False)]
    graph.marks_prompts = not layout.include_prompt
    return graph, outputs


def reference(
    model: Any, layout: SentenceLayout, texts: list[str], prompt: str | None = None
) -> npt.NDArray[Any]:
    """`encode` of `texts` with `prompt` (none by default): [texts, dim] vectors, or [texts, vocab]
    SPLADE weights."""
    import torch

    with torch.no_grad():
        if layout.is_splade:
            encoded = model.encode(
                texts, batch_size=len(texts), convert_to_tensor=True, convert_to_sparse_tensor=False
            )
            return np.asarray(encoded.cpu().numpy(), dtype=np.float32)
        return np.asarray(
            model.encode(texts, prompt=prompt or "", batch_size=len(texts), convert_to_numpy=True),
            dtype=np.float32,
        )
