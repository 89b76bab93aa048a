"""Sequence classifiers: one logit per label."""

from prensa.layouts.base import Layout, ModelFiles, ModelType, PairInput
from prensa.manifest import Task
from prensa.stages import contract


def is_classifier(files: ModelFiles) -> bool:
    """A sequence classifier with more than one label."""
    return files.architecture_ends("ForSequenceClassification") and files.labels > 1


CLASSIFIER = Layout(
    name="classifier",
    task=Task.CLASSIFY,
    model_type=ModelType.CLASSIFIER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.OPTIONAL,
    graph_outputs=frozenset({contract.LOGITS}),
    named_labels=True,
    detect=is_classifier,
)
