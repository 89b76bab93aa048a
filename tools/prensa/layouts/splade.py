"""SPLADE: a masked LM's vocabulary weights, max-pooled over the text's tokens."""

from prensa.layouts.base import Layout, ModelFiles, ModelType
from prensa.manifest import Task
from prensa.stages import contract


def is_splade(files: ModelFiles) -> bool:
    """sentence-transformers' SPLADE modules, or a bare masked LM (its vocabulary weights)."""
    if files.sentence_modules:
        return files.sentence_splade
    return files.architecture_ends("ForMaskedLM")


SPLADE = Layout(
    name="splade",
    task=Task.SPLADE,
    model_type=ModelType.EMBEDDING,
    default_operation="embed_sparse",
    answers=frozenset({contract.SPARSE_IDS}),
    cacheable=True,
    token_pooling="splade",
    graph_outputs=frozenset({contract.SPLADE_WEIGHTS}),
    detect=is_splade,
)
