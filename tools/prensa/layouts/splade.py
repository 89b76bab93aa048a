"""SPLADE: a masked LM's vocabulary weights, max-pooled over the text's tokens."""

from prensa.layouts.base import Layout, ModelType
from prensa.manifest import Task
from prensa.stages import contract

SPLADE = Layout(
    name="splade",
    task=Task.SPLADE,
    model_type=ModelType.EMBEDDING,
    default_operation="embed_sparse",
    answers=frozenset({contract.SPARSE_IDS}),
    cacheable=True,
    token_pooling="splade",
)
