"""LLM rerankers (Qwen3-Reranker): a pair written into the model's prompt, scored by its yes/no logits."""

from collections.abc import Iterable

from prensa.export.source import SourceError
from prensa.layouts.base import Layout, ModelFiles, ModelType, PairInput, Scoring
from prensa.manifest import Task
from prensa.stages import contract

ARCHITECTURES = ("Qwen3ForCausalLM",)  # the causal LMs served as Qwen3-Reranker
MAX_LENGTH = 8192  # the card's


def known(architectures: Iterable[str]) -> bool:
    """One of the causal LMs served as Qwen3-Reranker."""
    return any(a in ARCHITECTURES for a in architectures)


def is_llm_reranker(files: ModelFiles) -> bool:
    """A causal LM without sentence-transformers modules is an LLM reranker, or nothing prensa can
    guess: refused by name (a decoder embedder comes with its modules, or is asked for)."""
    if files.sentence_modules or not files.architecture_ends("ForCausalLM"):
        return False
    if known(files.architectures):
        return True
    raise SourceError(
        f"{files.name} is a causal LM ({', '.join(files.architectures)}) without a sentence-transformers "
        f"config: prensa serves {', '.join(ARCHITECTURES)} as an LLM reranker "
        "(Qwen3-Reranker), and decoder embedders from their sentence-transformers directory "
        "(modules.json with a Pooling module); pass --task embed to pool its last token"
    )


LLM_RERANKER = Layout(
    name="llm-reranker",
    task=Task.RERANK,
    model_type=ModelType.RERANKER,
    default_operation="predict",
    answers=frozenset({contract.LOGITS}),
    pair_input=PairInput.OPTIONAL,
    scoring=Scoring.PAIRS,
    prompted_pairs=True,
    graph_outputs=frozenset({contract.LOGITS}),
    default_max_length=MAX_LENGTH,
    detect=is_llm_reranker,
)
