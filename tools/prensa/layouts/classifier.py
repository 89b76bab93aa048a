"""Sequence classifiers: one logit per label."""

from prensa.layouts.base import Layout, ModelType
from prensa.manifest import Task

CLASSIFIER = Layout(
    name="classifier",
    task=Task.CLASSIFY,
    model_type=ModelType.CLASSIFIER,
    default_operation="predict",
)
