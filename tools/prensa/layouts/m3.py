"""bge-m3: dense, sparse lexical weights and ColBERT vectors from one pass, scored as a hybrid."""

from prensa.layouts.base import Layout, ModelType, Scoring
from prensa.manifest import Task
from prensa.stages import contract

M3 = Layout(
    name="m3",
    task=Task.M3,
    model_type=ModelType.EMBEDDING,
    default_operation="embed",
    answers=frozenset({contract.DENSE, contract.SPARSE_IDS, contract.COLBERT}),
    scoring=Scoring.HYBRID,
    scoring_outputs=frozenset({contract.DENSE, contract.SPARSE_IDS, contract.COLBERT}),
)
