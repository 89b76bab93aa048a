"""Cross-encoders: one logit per (query, passage) pair read as one input."""

from prensa.layouts.base import Layout, ModelType, Scoring
from prensa.manifest import Task

CROSS_ENCODER = Layout(
    name="cross-encoder",
    task=Task.RERANK,
    model_type=ModelType.RERANKER,
    default_operation="predict",
    scoring=Scoring.PAIRS,
)
