"""LLM rerankers (Qwen3-Reranker): a pair written into the model's prompt, scored by its yes/no logits."""

from prensa.layouts.base import Layout, ModelType, PairInput, Scoring
from prensa.manifest import Task
from prensa.stages import contract

LLM_RERANKER = Layout(
    name="llm-reranker",
    task=Task.RERANK,
    model_type=ModelType.RERANKER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.OPTIONAL,
    scoring=Scoring.PAIRS,
    prompted_pairs=True,
)
