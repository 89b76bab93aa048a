"""Sequence classifiers: one logit per label."""

from prensa.layouts.base import Layout, ModelType, PairInput
from prensa.manifest import Task
from prensa.stages import contract

CLASSIFIER = Layout(
    name="classifier",
    task=Task.CLASSIFY,
    model_type=ModelType.CLASSIFIER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.OPTIONAL,
)
