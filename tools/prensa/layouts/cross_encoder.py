"""Cross-encoders: one logit per (query, passage) pair read as one input."""

from prensa.layouts.base import Layout, ModelType, PairInput, Scoring
from prensa.manifest import Task
from prensa.stages import contract

CROSS_ENCODER = Layout(
    name="cross-encoder",
    task=Task.RERANK,
    model_type=ModelType.RERANKER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.REQUIRED,
    scoring=Scoring.PAIRS,
)
