"""What a route asks of a model, one typed request per operation, and what each answers.

Every operation runs through one template, `Service.run`: the batch's checks, the operation's own,
its framing of the inputs (chunked windows, a query framed by its own tokenizer, an LLM reranker's
prompt), the permits, the inference. An `Ask` adds only what is its own: what it refuses, how it
frames its inputs, the outputs it reads and how it finishes them (vLLM's serving template and
per-task processors, cut the same way). Every field is given by keyword: a call site says what it
means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np
import numpy.typing as npt

from prensa.gateway.core.chunking import (
    Chunking,
    Windows,
    concatenated,
    max_per_id,
    mean_by_tokens,
    summed,
)
from prensa.gateway.core.engine import Inference, Inferred
from prensa.gateway.core.hybrid import M3Rows
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import (
    Item,
    TokenRows,
    Truncation,
    joined_chunks,
    query_rows,
)
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.layouts import Scoring
from prensa.manifest import Pooling
from prensa.stages import contract, load_stage

if TYPE_CHECKING:
    from prensa.gateway.core.service import Service

# The pool stage's own numpy functions: when Triton's pool stage cannot give what was asked
# (`normalize: false` on a model that normalises) the gateway pools with the very same code.
POOL_STAGE = load_stage("pool")
R = TypeVar("R")
M3_OUTPUTS = (contract.DENSE, contract.SPARSE_IDS, contract.SPARSE_WEIGHTS, contract.COLBERT)
# Windows of a chunked input fit the model by construction; re-tokenized from their span of the text
# one may come out a token longer at its edges, which right truncation drops instead of refusing.
WINDOW_TRUNCATION = Truncation(True, "right")
# Late chunking reads its chunks as one document in one pass: nothing of it may be cut.
UNCUT = Truncation(False, "right")


@dataclass(frozen=True)
class Vectors:
    """One pooled vector per input."""

    rows: npt.NDArray[np.float32]  # [n, dim]
    num_tokens: npt.NDArray[Any]  # [n], special tokens included


@dataclass(frozen=True)
class SparseVectors:
    """Per input, its non-zero vocabulary ids (ascending) and their weights."""

    ids: list[npt.NDArray[Any]]
    weights: list[npt.NDArray[Any]]
    num_tokens: npt.NDArray[Any]


@dataclass(frozen=True)
class TokenVectors:
    """Per input, one vector per token it keeps."""

    rows: list[npt.NDArray[Any]]  # [tokens, dim] each
    num_tokens: npt.NDArray[Any]


@dataclass(frozen=True)
class Scores:
    """Scores per input ([n, labels], or [n] for relevance) and the tokens each read."""

    values: npt.NDArray[Any]
    num_tokens: npt.NDArray[Any]


@dataclass(frozen=True)
class Framed:
    """An ask's inputs as they go to Triton: its own, or the windows of its long texts (`windows`),
    or texts the ask rewrote (an LLM reranker's prompts), or token rows it framed itself."""

    items: list[Item]
    truncation: Truncation
    pairs: Sequence[str | None] | None = None
    windows: Windows | None = None
    rows: TokenRows | None = None


@dataclass(frozen=True, kw_only=True)
class JoinedFrame(Framed):
    """Late chunking's one sequence, and where each chunk's own tokens lie in it."""

    spans: list[range]


@dataclass(frozen=True, kw_only=True)
class Ask(Generic[R]):
    """One operation on `model`'s `items`, cut as `truncation` says."""

    model: ServedModel
    items: list[Item]
    truncation: Truncation

    def check(self, service: Service) -> None:
        """Refuse, by name, what this operation cannot serve for its model (after the batch limits)."""

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        """The inputs as Triton gets them: the ask's own, unless the operation frames them."""
        return Framed(self.items, self.truncation)

    def inferences(self, framed: Framed) -> list[Inference]:
        """What to ask of Triton: one inference, or one per group of a mixed request."""
        raise NotImplementedError

    def inference(
        self, framed: Framed, outputs: tuple[str, ...], *, encoder_only: bool = False
    ) -> Inference:
        """One Triton call on all of `framed`, for `outputs` (`<name>_encode`'s, `encoder_only`)."""
        return Inference(
            model=self.model,
            items=framed.items,
            truncation=framed.truncation,
            outputs=outputs,
            encoder_only=encoder_only,
            rows=framed.rows,
        )

    def finish(self, results: list[Inferred], framed: Framed) -> R:
        """The answer from the outputs of `inferences`, in their order."""
        raise NotImplementedError


async def chunked(
    ask: Ask[Any], chunking: Chunking | None, service: Service, context: RequestContext
) -> Framed:
    """`ask`'s inputs, each longer than its model's window cut into windows when `chunking` says so."""
    windows = await service.chunk_windows(ask.model, ask.items, chunking, context)
    if windows is None:
        return Framed(ask.items, ask.truncation)
    return Framed(windows.items, WINDOW_TRUNCATION, windows=windows)


@dataclass(frozen=True, kw_only=True)
class DenseAsk(Ask[Vectors]):
    """Pooled vectors; `dimensions` keeps the first N, then (re-)normalises when asked. With
    `chunking`, a long text's vector is its windows' mean weighted by tokens (see `chunking`)."""

    normalize: bool = True
    dimensions: int | None = None
    chunking: Chunking | None = None

    def check(self, service: Service) -> None:
        service.check_dimensions(self.model, self.dimensions)

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        return await chunked(self, self.chunking, service, context)

    def unnormalized_output(self) -> str | None:
        """The output to pool unnormalised vectors from, when the model's pool stage normalises: the
        graph's own pooled vector, else the raw encoder output pooled here."""
        if self.normalize or not self.model.normalize:
            return None
        if contract.SENTENCE_EMBEDDING in self.model.encode_outputs:
            return contract.SENTENCE_EMBEDDING
        return contract.LAST_HIDDEN_STATE

    def inferences(self, framed: Framed) -> list[Inference]:
        raw = self.unnormalized_output()
        if raw is not None:
            return [self.inference(framed, (raw,), encoder_only=True)]
        outputs = (contract.DENSE, contract.NUM_TOKENS)
        return [self.inference(framed, outputs)]

    def finish(self, results: list[Inferred], framed: Framed) -> Vectors:
        (result,) = results
        raw = self.unnormalized_output()
        if raw == contract.LAST_HIDDEN_STATE:
            vectors = POOL_STAGE.pool_tokens(result.outputs[raw], result.mask, self.model.pooling)
        else:
            vectors = result.outputs[raw or contract.DENSE]
        num_tokens, windows = result.num_tokens, framed.windows
        if windows:
            vectors = mean_by_tokens(vectors, num_tokens, windows)
            num_tokens = summed(num_tokens, windows)
        if self.dimensions is not None:
            vectors = vectors[:, : self.dimensions]
        if self.normalize and (self.dimensions is not None or not self.model.normalize or windows):
            vectors = POOL_STAGE.l2_normalize(vectors)
        return Vectors(np.ascontiguousarray(vectors, dtype=np.float32), num_tokens)


@dataclass(frozen=True, kw_only=True)
class SparseAsk(Ask[SparseVectors]):
    """bge-m3's sparse head or a SPLADE model's vocabulary weights."""

    def inferences(self, framed: Framed) -> list[Inference]:
        outputs = (contract.SPARSE_IDS, contract.SPARSE_WEIGHTS, contract.NUM_TOKENS)
        return [self.inference(framed, outputs)]

    def finish(self, results: list[Inferred], framed: Framed) -> SparseVectors:
        (result,) = results
        ids, weights = result.outputs[contract.SPARSE_IDS], result.outputs[contract.SPARSE_WEIGHTS]
        keep = ids >= 0
        return SparseVectors(
            [row[kept] for row, kept in zip(ids, keep)],
            [row[kept] for row, kept in zip(weights, keep)],
            result.num_tokens,
        )


@dataclass(frozen=True, kw_only=True)
class ColbertAsk(Ask[TokenVectors]):
    """Multi-vectors: bge-m3's `num_tokens - 1` per input (CLS dropped; queries and documents
    alike); a late-interaction model's as PyLate's `encode(is_query=query)`, its documents framed by
    the tokenizer as any model's inputs, its queries framed here by the model's query tokenizer and
    always cut (and expanded) to its query length as PyLate cuts them."""

    query: bool = False

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        if not (self.query and self.model.layout.token_vectors):
            return Framed(self.items, self.truncation)
        framing = self.model.queries
        if framing is None:
            raise GatewayError(
                ErrorKind.TOKENIZER,
                f"model `{self.model.name}` has no query tokenizer beside its tokenizer file (the "
                "gateway's log names it); its queries cannot be framed",
            )
        if not all(isinstance(item, str) for item in self.items):
            raise validation(
                f"model `{self.model.name}` frames each query with its own tokens: give queries "
                "as texts, not token ids"
            )
        texts = [contract.read_text(str(item), self.model.strip_texts) for item in self.items]
        rows = await service.tokenizer_work(len(texts), query_rows, framing, texts)
        return Framed(self.items, self.truncation, rows=rows)

    def inferences(self, framed: Framed) -> list[Inference]:
        outputs = (contract.COLBERT, contract.NUM_TOKENS)
        return [self.inference(framed, outputs)]

    def finish(self, results: list[Inferred], framed: Framed) -> TokenVectors:
        (result,) = results
        vectors = result.outputs[contract.COLBERT]
        if self.model.layout.token_vectors:
            # the pool stage moves each row's vectors to its front; zero rows follow them
            counts = np.any(vectors != 0, axis=2).sum(axis=1).tolist()
            return TokenVectors([vectors[i, :n] for i, n in enumerate(counts)], result.num_tokens)
        return TokenVectors(
            [vectors[i, : n - 1] for i, n in enumerate(result.num_tokens.tolist())],
            result.num_tokens,
        )


@dataclass(frozen=True, kw_only=True)
class HiddenAsk(ColbertAsk):
    """The encoder's last hidden state, one vector per token, no pooling; a late-interaction
    model's per-token vectors are its documents' multi-vectors."""

    def inferences(self, framed: Framed) -> list[Inference]:
        if self.model.layout.token_vectors:
            return super().inferences(framed)
        outputs = (contract.LAST_HIDDEN_STATE,)
        return [self.inference(framed, outputs, encoder_only=True)]

    def finish(self, results: list[Inferred], framed: Framed) -> TokenVectors:
        if self.model.layout.token_vectors:
            return super().finish(results, framed)
        (result,) = results
        hidden = result.outputs[contract.LAST_HIDDEN_STATE]
        counts = result.num_tokens.tolist()
        return TokenVectors([hidden[i, :n] for i, n in enumerate(counts)], result.num_tokens)


def late_chunking_refusal(model: ServedModel) -> str | None:
    """Why `model`'s vector of a chunk cannot be the mean of the chunk's own token states, or None:
    a decoder's last token, SPLADE's vocabulary weights, and a graph that pools and projects
    (sentence-transformers' Dense) before the states reach the gateway each make another vector."""
    if not model.layout.dense:
        return f"it is a {model.layout.name} model, not a dense embedder"
    if model.pooling == Pooling.LAST.value:
        return "it pools its last token (a decoder), which no chunk but the last has"
    if contract.SENTENCE_EMBEDDING in model.encode_outputs:
        return "its graph pools and projects (a Dense layer) before the token states leave it"
    if contract.LAST_HIDDEN_STATE not in model.encode_outputs:
        return "its encoder does not give the token states"
    return None


@dataclass(frozen=True, kw_only=True)
class LateChunksAsk(Ask[Vectors]):
    """Jina's late chunking: `items`, chunks of one document in order, read in one pass, each
    chunk's vector the mean of its own tokens' states (L2-normalised when `normalize`), so a
    chunk's vector carries what the chunks around it say. Models that do not pool their vector
    from those states alone are refused by name."""

    truncation: Truncation = UNCUT
    normalize: bool = True
    dimensions: int | None = None

    def check(self, service: Service) -> None:
        service.check_dimensions(self.model, self.dimensions)
        refusal = late_chunking_refusal(self.model)
        if refusal is not None:
            raise validation(f"`late_chunking` on model `{self.model.name}`: {refusal}")
        if not all(type(item) is str for item in self.items):  # prompted texts and token ids alike
            raise validation(
                "`late_chunking` reads the inputs as one document: give plain texts, without a "
                "prompt per input or token ids"
            )

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        texts = cast("list[str]", self.items)
        joined = await service.tokenizer_work(
            len(texts), joined_chunks, self.model.require_tokenizer(), texts, self.model.max_length
        )
        return JoinedFrame([joined.ids], self.truncation, spans=joined.spans)

    def inferences(self, framed: Framed) -> list[Inference]:
        outputs = (contract.LAST_HIDDEN_STATE,)
        return [self.inference(framed, outputs, encoder_only=True)]

    def finish(self, results: list[Inferred], framed: Framed) -> Vectors:
        (result,) = results
        spans = cast(JoinedFrame, framed).spans
        states = result.outputs[contract.LAST_HIDDEN_STATE][0]
        vectors = np.stack([states[span.start : span.stop].mean(axis=0) for span in spans])
        # each chunk counts its own tokens; the first also the special tokens around them all
        counts = np.asarray([len(span) for span in spans], dtype=np.int64)
        counts[0] += len(framed.items[0]) - int(counts.sum())
        if self.dimensions is not None:
            vectors = vectors[:, : self.dimensions]
        if self.normalize:
            vectors = POOL_STAGE.l2_normalize(vectors)
        return Vectors(np.ascontiguousarray(vectors, dtype=np.float32), counts)


@dataclass(frozen=True, kw_only=True)
class M3Ask(Ask[M3Rows]):
    """Any of bge-m3's dense, sparse and ColBERT outputs (`contract` names) for `items`, from one
    forward pass: one Triton call per chunk, whatever the subset. With `chunking`, a long text's
    windows combine as `chunking` says."""

    wanted: frozenset[str] = frozenset(M3_OUTPUTS)
    chunking: Chunking | None = None

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        return await chunked(self, self.chunking, service, context)

    def inferences(self, framed: Framed) -> list[Inference]:
        outputs = (*(name for name in M3_OUTPUTS if name in self.wanted), contract.NUM_TOKENS)
        return [self.inference(framed, outputs)]

    def finish(self, results: list[Inferred], framed: Framed) -> M3Rows:
        (result,) = results
        got, counts = result.outputs, result.num_tokens.tolist()
        ids = got.get(contract.SPARSE_IDS)
        keep = ids >= 0 if ids is not None else None
        rows = M3Rows(
            dense=np.ascontiguousarray(got[contract.DENSE], dtype=np.float32)
            if contract.DENSE in got
            else None,
            sparse_ids=[row[kept] for row, kept in zip(ids, keep)]
            if ids is not None and keep is not None
            else None,
            sparse_weights=[row[kept] for row, kept in zip(got[contract.SPARSE_WEIGHTS], keep)]
            if keep is not None
            else None,
            colbert=[got[contract.COLBERT][i, : n - 1] for i, n in enumerate(counts)]
            if contract.COLBERT in got
            else None,
            num_tokens=result.num_tokens,
        )
        return rows if framed.windows is None else combined(rows, framed.windows)


def combined(rows: M3Rows, windows: Windows) -> M3Rows:
    """bge-m3's outputs of chunked windows, one per text again: the dense mean by tokens
    (re-normalised), the sparse maximum per id, the ColBERT vectors in order."""
    sparse = (
        max_per_id(rows.sparse_ids, rows.sparse_weights, windows)
        if rows.sparse_ids is not None and rows.sparse_weights is not None
        else None
    )
    return M3Rows(
        dense=POOL_STAGE.l2_normalize(mean_by_tokens(rows.dense, rows.num_tokens, windows))
        if rows.dense is not None
        else None,
        sparse_ids=sparse[0] if sparse else None,
        sparse_weights=sparse[1] if sparse else None,
        colbert=concatenated(rows.colbert, windows) if rows.colbert is not None else None,
        num_tokens=summed(rows.num_tokens, windows),
        chunks=windows.counts,
    )


@dataclass(frozen=True, kw_only=True)
class ScoresAsk(Ask[Scores]):
    """[n, labels] scores (or logits with `raw_scores`) of single texts (`pairs` None at their
    index) and pairs, mixed as they come. An LLM reranker scores pairs only, each written into its
    prompt with `instruction` (or its own)."""

    pairs: Sequence[str | None] | None = None  # None: single texts only
    raw_scores: bool = False
    instruction: str | None = None

    def paired(self) -> Sequence[str | None]:
        """Each text's pair, None for a text on its own."""
        return self.pairs if self.pairs is not None else [None] * len(self.items)

    def check(self, service: Service) -> None:
        model, pairs = self.model, self.paired()
        if any(pair == "" for pair in pairs):
            raise validation("`inputs` cannot be empty")
        if model.prompted is not None:
            if any(pair is None for pair in pairs):
                raise validation(
                    f"model `{model.name}` is an LLM reranker: it scores (query, document) pairs"
                )
            return
        if self.instruction is not None:
            raise validation(
                f"`instruction` applies to LLM rerankers; model `{model.name}` is a cross-encoder"
            )
        if not model.takes_pairs and any(pair is not None for pair in pairs):
            raise validation(
                f"model `{model.name}` classifies single texts; give one text per input"
            )

    async def frame(self, service: Service, context: RequestContext) -> Framed:
        template = self.model.prompted
        if template is None:
            return Framed(self.items, self.truncation, pairs=self.paired())
        texts = cast("list[str]", self.items)
        await service.check_room(self.model, texts, self.instruction)
        prompts: list[Item] = [
            template.text(text, cast(str, pair), self.instruction)
            for text, pair in zip(texts, self.paired())
        ]
        return Framed(prompts, self.truncation, pairs=[None] * len(prompts))

    def output(self) -> str:
        return contract.LOGITS if self.raw_scores else contract.SCORES

    @staticmethod
    def groups(framed: Framed) -> list[tuple[list[int], list[str] | None]]:
        """The rows of single texts and of pairs (each group Triton's call), the non-empty ones."""
        pairs = cast("Sequence[str | None]", framed.pairs)
        singles = [i for i, pair in enumerate(pairs) if pair is None]
        doubles = [i for i, pair in enumerate(pairs) if pair is not None]
        found = ((singles, None), (doubles, [cast(str, pairs[i]) for i in doubles]))
        return [(rows, group_pairs) for rows, group_pairs in found if rows]

    def inferences(self, framed: Framed) -> list[Inference]:
        outputs = (self.output(), contract.NUM_TOKENS)
        return [
            Inference(
                model=self.model,
                items=[framed.items[i] for i in rows],
                pairs=pairs,
                truncation=framed.truncation,
                outputs=outputs,
            )
            for rows, pairs in self.groups(framed)
        ]

    def finish(self, results: list[Inferred], framed: Framed) -> Scores:
        name, size = self.output(), len(framed.items)
        values = np.zeros((size, results[0].outputs[name].shape[1]), dtype=np.float32)
        tokens = np.zeros(size, dtype=np.int64)
        for (rows, _), result in zip(self.groups(framed), results):
            values[rows], tokens[rows] = result.outputs[name], result.num_tokens
        return Scores(values, tokens)


@dataclass(frozen=True, kw_only=True)
class RelevanceAsk:
    """One score per text against `query`: a cross-encoder's (sigmoid, or the logit with
    `raw_scores`), bge-m3's `colbert+sparse+dense` hybrid (`weights`), a late-interaction model's
    MaxSim, an LLM reranker's with `instruction` in place of its own. A hybrid or MaxSim score has
    no activation: `raw_scores` leaves it as it is. Runs as the asks above (`Service.relevance`)."""

    model: ServedModel
    query: str
    texts: list[str]
    truncation: Truncation
    raw_scores: bool = False
    weights: Sequence[float] | None = None
    instruction: str | None = None

    def refusal(self) -> str | None:
        """The option this model's score has no use for, by name, or None."""
        model = self.model
        if model.layout.scoring is Scoring.MAXSIM:
            said = (
                "`weights` applies to bge-m3 models"
                if self.weights is not None
                else "`instruction` applies to LLM rerankers"
                if self.instruction is not None
                else None
            )
            return f"model `{model.name}` is a late-interaction model: {said}" if said else None
        if model.is_m3:
            if self.instruction is not None:
                return f"`instruction` applies to LLM rerankers; model `{model.name}` is bge-m3"
            return None
        if self.weights is not None:
            return f"`weights` applies to bge-m3 models; `{model.name}` is a cross-encoder"
        return None
