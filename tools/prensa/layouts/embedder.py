"""Pooled embedders: sentence-transformers layouts (encoders and decoders) and plain encoders."""

from prensa.layouts.base import Layout, ModelType
from prensa.manifest import Task
from prensa.stages import contract

EMBEDDER = Layout(
    name="embedder",
    task=Task.EMBED,
    model_type=ModelType.EMBEDDING,
    default_operation="embed",
    answers=frozenset({contract.DENSE}),
    cacheable=True,
    graph_outputs=frozenset({contract.LAST_HIDDEN_STATE}),
)
