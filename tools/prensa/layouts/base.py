"""What a kind of model is, said once: the `Layout` each subsystem asks instead of switching on
`Task` (TEI resolves its `ModelType` and `Pool` once; vLLM gives each architecture its pooler)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from prensa.manifest import Task
from prensa.stages import contract


class Capability(str, Enum):
    """What a route needs from a model; the value is used in error messages."""

    DENSE = "dense embeddings"
    SPARSE = "sparse embeddings"
    COLBERT = "ColBERT multi-vectors"
    HIDDEN = "per-token hidden states"
    RERANK = "reranking"
    M3 = "bge-m3's dense, sparse and ColBERT outputs"
    PREDICT = "classification"


# What answers with vectors: they mean something only beside vectors of the same model version, so
# a version on trial may see a copy of such a model's requests but never answer one of them.
VECTORS = frozenset(
    {Capability.DENSE, Capability.SPARSE, Capability.COLBERT, Capability.HIDDEN, Capability.M3}
)


class Scoring(str, Enum):
    """How a layout scores a query against texts."""

    PAIRS = "pairs"  # each (query, text) read as one input: a cross-encoder, an LLM reranker
    HYBRID = "hybrid"  # bge-m3's weighted dense, sparse and ColBERT scores of query and text apart
    MAXSIM = "maxsim"  # late interaction: each query vector's best match among the text's, summed


class PairInput(str, Enum):
    """How the ensemble takes a second text (`text_pair`)."""

    REQUIRED = "required"  # a cross-encoder scores (query, passage) pairs only
    # a classifier reads one text or a pair; an LLM reranker a pair or one already in its prompt
    OPTIONAL = "optional"


class ModelType(str, Enum):
    """TEI's kind of model (`/info`'s `model_type`, gRPC's `ModelType`)."""

    EMBEDDING = "embedding"
    RERANKER = "reranker"
    CLASSIFIER = "classifier"


@dataclass(frozen=True, kw_only=True)
class ModelFiles:
    """What detection reads of a model directory, read once by the export: a layout claims a model
    from these alone."""

    name: str
    architectures: tuple[str, ...]  # config.json's
    labels: int  # config.json's `id2label` entries (1 when it names none)
    has: Callable[[str], bool]  # whether a file (relative to the model's directory) is there
    sentence_modules: bool = False  # sentence-transformers' modules.json describes it
    sentence_splade: bool = False  # ...as SPLADE (its pooling is SpladePooling)

    def architecture_ends(self, suffix: str) -> bool:
        return any(a.endswith(suffix) for a in self.architectures)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One kind of model prensa serves, as the repository renders it and the gateway serves it.

    What a served model can do follows from its layout and the outputs its export has
    (`ServedModel.can`): the layout says what its ensemble answers, how it takes a second text, how
    it scores a query against texts, what its per-token vectors mean, and which operation a body
    that names none runs."""

    name: str
    task: Task  # what its export writes in `prensa.json` and the ensemble's `task` parameter
    model_type: ModelType
    default_operation: str  # the operation TEI's `POST /` runs when the body does not say
    # what its ensemble answers besides `num_tokens`: `contract.DENSE`, `SPARSE_IDS` (with
    # `SPARSE_WEIGHTS`), `COLBERT`, `LOGITS` (with `SCORES`)
    answers: frozenset[str]
    pair_input: PairInput | None = None  # None: the ensemble takes no `text_pair`
    # Triton's response cache may keep its answers: its clients ask one output set of the same inputs
    # (Triton's cache key has no requested outputs)
    cacheable: bool = False
    scoring: Scoring | None = None  # None: it scores no query against texts
    # the ensemble outputs its scoring reads: an export without one of them ranks nothing
    scoring_outputs: frozenset[str] = frozenset()
    # its per-token vectors are what it answers for a text (a late-interaction model's documents,
    # which its pool stage moves to the front of each row), and its queries are framed apart
    token_vectors: bool = False
    # `/info`'s pooling, for layouts that answer per-token weights or vectors rather than one pooled
    token_pooling: str | None = None
    # its pairs are written into a prompt by the tokenize stage (an LLM reranker), not given as two texts
    prompted_pairs: bool = False
    # its logits are named labels: the export keeps config.json's `id2label` for its answers
    named_labels: bool = False
    # the max length its export serves unless told (`--max-length`), below what the model's configs
    # allow: a reranker's card states what it was trained on, not its positions
    default_max_length: int | None = None
    # the encoder graph's outputs its pool stage reads: an ONNX file without them cannot serve it
    graph_outputs: frozenset[str] = frozenset()
    # whether a model's files are this layout's (`layouts.detect` asks in `LAYOUTS`' order); None: it
    # is never guessed (a late-interaction model is read from its own files, a pooled embedder is
    # what no other layout claims)
    detect: Callable[[ModelFiles], bool] | None = field(default=None, compare=False)

    @property
    def scores_pairs(self) -> bool:
        """Its relevance scores read (query, text) pairs as one input, as a cross-encoder's: its
        clients and benchmarks send pairs (bge-m3 and late-interaction models encode each text apart)."""
        return self.scoring is Scoring.PAIRS

    @property
    def dense(self) -> bool:
        """A pooled dense vector is among its answers (the dense routes' models, late chunking's)."""
        return contract.DENSE in self.answers
