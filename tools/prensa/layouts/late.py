"""Late interaction (PyLate, HF_ColBERT): one vector per kept token, a query scored by MaxSim."""

from prensa.layouts.base import Layout, ModelType, Scoring
from prensa.manifest import Task
from prensa.stages import contract

LATE = Layout(
    name="late",
    task=Task.LATE,
    model_type=ModelType.EMBEDDING,
    default_operation="embed_colbert",
    answers=frozenset({contract.COLBERT}),
    scoring=Scoring.MAXSIM,
    token_vectors=True,
    token_pooling="colbert",
    graph_outputs=frozenset({contract.COLBERT_VECS}),
)
