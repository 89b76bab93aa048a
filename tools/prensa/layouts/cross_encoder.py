"""Cross-encoders: one logit per (query, passage) pair read as one input."""

from prensa.layouts.base import Layout, ModelFiles, ModelType, PairInput, Scoring
from prensa.manifest import Task
from prensa.stages import contract


def is_cross_encoder(files: ModelFiles) -> bool:
    """A sequence classifier with one label: its logit is the pair's relevance."""
    return files.architecture_ends("ForSequenceClassification") and files.labels == 1


CROSS_ENCODER = Layout(
    name="cross-encoder",
    task=Task.RERANK,
    model_type=ModelType.RERANKER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.REQUIRED,
    scoring=Scoring.PAIRS,
    graph_outputs=frozenset({contract.LOGITS}),
    default_max_length=512,  # bge-reranker-v2-m3's and most cross-encoders' training length
    detect=is_cross_encoder,
)
