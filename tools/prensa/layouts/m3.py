"""bge-m3: dense, sparse lexical weights and ColBERT vectors from one pass, scored as a hybrid."""

from prensa.layouts.base import Layout, ModelFiles, ModelType, Scoring
from prensa.manifest import Task
from prensa.stages import contract

# its sparse and ColBERT heads, beside the transformer
HEADS = ("sparse_linear.pt", "colbert_linear.pt")


def is_m3(files: ModelFiles) -> bool:
    """A head file is there, or the model is named bge-m3 (its heads then missing: the plan says so)."""
    return any(files.has(head) for head in HEADS) or "bge-m3" in files.name.lower()


M3 = Layout(
    name="m3",
    task=Task.M3,
    model_type=ModelType.EMBEDDING,
    default_operation="embed",
    answers=frozenset({contract.DENSE, contract.SPARSE_IDS, contract.COLBERT}),
    scoring=Scoring.HYBRID,
    scoring_outputs=frozenset({contract.DENSE, contract.SPARSE_IDS, contract.COLBERT}),
    graph_outputs=frozenset(
        {contract.LAST_HIDDEN_STATE, contract.TOKEN_WEIGHTS, contract.COLBERT_VECS}
    ),
    detect=is_m3,
)
