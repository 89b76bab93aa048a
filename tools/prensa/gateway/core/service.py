"""The gateway's work per task, with no HTTP in sight: each route's call becomes `Inference`s that
`engine.Engine` runs.

Tasks that cannot be told by the ensemble's outputs alone are finished here: unnormalised vectors
pooled with the pool stage's own code, Matryoshka cuts, chunked inputs combined, bge-m3's hybrid
scores, an LLM reranker's prompt written around each pair.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.chunking import (
    Chunking,
    Windows,
    concatenated,
    max_per_id,
    mean_by_tokens,
    split_items,
    summed,
)
from prensa.gateway.core.engine import Engine, Inference, gather
from prensa.gateway.core.hybrid import DEFAULT_WEIGHTS, HYBRID, M3Rows, late_score
from prensa.gateway.core.hybrid import scores as scores_of
from prensa.gateway.core.limits import Permits
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import (
    Item,
    PromptedText,
    Truncation,
    filling_tokens,
    has_long_texts,
    joined_chunks,
    may_fill,
    query_rows,
)
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import stage
from prensa.manifest import Pooling, Task
from prensa.stages import contract, load_stage

# The pool stage's own numpy functions: when Triton's pool stage cannot give what was asked
# (`normalize: false` on a model that normalises) the gateway pools with the very same code.
POOL_STAGE = load_stage("pool")
T = TypeVar("T")
M3_OUTPUTS = (contract.DENSE, contract.SPARSE_IDS, contract.SPARSE_WEIGHTS, contract.COLBERT)
# Windows of a chunked input fit the model by construction; re-tokenized from their span of the text
# one may come out a token longer at its edges, which right truncation drops instead of refusing.
WINDOW_TRUNCATION = Truncation(True, "right")


@dataclass
class Embeddings:
    # [n, dim], or one array per input (sparse ids, token vectors)
    rows: list[npt.NDArray[Any]] | npt.NDArray[Any]
    num_tokens: npt.NDArray[Any]  # [n], special tokens included
    # sparse only: the weight of each id in `rows`
    weights: list[npt.NDArray[Any]] = field(default_factory=list)


def check_batch(size: int, batch_limit: int, split: bool) -> None:
    """An empty batch is `Empty` (400); more inputs than the limit is `Validation` (422)."""
    if not size:
        raise GatewayError(ErrorKind.EMPTY, "`inputs` cannot be empty")
    if size > batch_limit and not split:
        raise GatewayError(
            ErrorKind.VALIDATION, f"batch size {size} > maximum allowed batch size {batch_limit}"
        )


def check_items(items: Sequence[Item], batch_limit: int, split: bool) -> None:
    """`check_batch`, and an empty input is `Validation` (422)."""
    check_batch(len(items), batch_limit, split)
    if any(len(item) == 0 for item in items):
        raise validation("`inputs` cannot be empty")


def late_chunking_refusal(model: ServedModel) -> str | None:
    """Why `model`'s vector of a chunk cannot be the mean of the chunk's own token states, or None:
    a decoder's last token, SPLADE's vocabulary weights, and a graph that pools and projects
    (sentence-transformers' Dense) before the states reach the gateway each make another vector."""
    if model.task not in (Task.EMBED, Task.M3):
        return f"it is a {model.task} model, not a dense embedder"
    if model.pooling == Pooling.LAST.value:
        return "it pools its last token (a decoder), which no chunk but the last has"
    if contract.SENTENCE_EMBEDDING in model.encode_outputs:
        return "its graph pools and projects (a Dense layer) before the token states leave it"
    if contract.LAST_HIDDEN_STATE not in model.encode_outputs:
        return "its encoder does not give the token states"
    return None


class Service:
    """What every API asks of the gateway, per task (dense vectors, sparse weights, ColBERT and
    token vectors, bge-m3's outputs, relevance and class scores), with the checks, permits,
    truncation and chunking each takes; each runs its inputs through `engine.infer`."""

    def __init__(
        self, settings: GatewaySettings, client: Backend, metrics: GatewayMetrics, permits: Permits
    ) -> None:
        self.settings = settings
        self.permits = permits
        self.engine = Engine(settings, client, metrics)

    def chunking(self, enabled: bool | None, overlap: int) -> Chunking | None:
        """A request's chunking of long inputs: what it asks (`enabled`, `overlap`), else (`enabled`
        None) the server's --chunk-long-inputs."""
        if enabled is None:
            return Chunking() if self.settings.chunk_long_inputs else None
        return Chunking(overlap) if enabled else None

    def truncation(self, truncate: bool | None, direction: str) -> Truncation:
        return Truncation(self.settings.auto_truncate if truncate is None else truncate, direction)

    def windowed(
        self,
        model: ServedModel,
        *,
        truncate: bool | None,
        direction: str,
        window: int | None,
        pairs: bool = False,
    ) -> Truncation:
        """`truncation`, or vLLM's `truncate_prompt_tokens` (`window`), not both: -1 cuts at the
        model's max length, k at each input's first k tokens, special tokens included (vLLM cuts a
        pooling model's inputs on the right). A window over the model's, or too small for the
        special tokens and a token of each text, is refused; so is one on an LLM reranker, whose
        prompt it would cut."""
        if window is None:
            return self.truncation(truncate, direction)
        if truncate is not None:
            raise validation("give `truncate` or `truncate_prompt_tokens`, not both")
        if window == -1:
            return Truncation(True, direction)
        if window > model.max_length:
            raise validation(
                f"`truncate_prompt_tokens` {window} is greater than model `{model.name}`'s max "
                f"length {model.max_length}"
            )
        if model.pair_template is not None:
            raise validation(
                f"`truncate_prompt_tokens` is not served for LLM rerankers (model `{model.name}`): "
                "a cut prompt loses the question it ends with; give -1 or leave it out"
            )
        least = model.require_tokenizer().num_special_tokens_to_add(pairs) + (2 if pairs else 1)
        if window < least:
            raise validation(
                f"`truncate_prompt_tokens` should be -1 or at least {least} (model `{model.name}`'s "
                f"special tokens and a token of each text), got {window}"
            )
        return Truncation(True, direction, window)

    def check(self, items: Sequence[Item]) -> None:
        check_items(items, self.settings.max_client_batch_size, self.settings.split_large_batches)

    def check_batch(self, size: int) -> None:
        """The batch limit alone, for routes where an empty input is valid (`/tokenize`, `/decode`)."""
        check_batch(size, self.settings.max_client_batch_size, self.settings.split_large_batches)

    def check_matryoshka(self, model: ServedModel, dimensions: int) -> None:
        """Cut vectors only where the model was trained to be cut (vLLM's rule), unless the operator
        allows any size (--allow-any-dimensions)."""
        if self.settings.allow_any_dimensions:
            return
        if model.matryoshka is None:
            raise GatewayError(
                ErrorKind.UNSUPPORTED,
                f"model `{model.name}` declares no Matryoshka dimensions: its "
                f"vectors cut to {dimensions} would be poor ones; ask for its full size or none, or "
                "start the gateway with --allow-any-dimensions",
            )
        if model.matryoshka and dimensions not in model.matryoshka:
            sizes = ", ".join(map(str, model.matryoshka))
            raise GatewayError(
                ErrorKind.UNSUPPORTED,
                f"model `{model.name}` is trained to be cut to {sizes} "
                f"dimensions, not {dimensions}",
            )

    def check_dimensions(self, model: ServedModel, dimensions: int | None) -> None:
        """`dimensions` within the model's size, and one it was trained to be cut to."""
        dim = model.dense_dim or 0
        if dimensions is not None and dimensions <= 0:
            raise validation("`dimensions` should be positive")
        if dimensions is not None and dimensions > dim:
            raise validation(
                f"`dimensions` should be at most the model's embedding size {dim}, got {dimensions}"
            )
        if dimensions is not None and dimensions != dim:
            self.check_matryoshka(model, dimensions)

    def tokenize_limit(self, model: ServedModel) -> int:
        """Tokens one /tokenize (ids one /decode) may hold: the flag's, else a full batch of full-length texts."""
        limit: int = (
            self.settings.max_tokenize_tokens
            or self.settings.max_client_batch_size * model.max_length
        )
        return limit

    async def tokenizer_work(self, inputs: int, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on `inputs` inputs in a thread, under the batch limit and holding their
        permits: tokenizer work on a large body takes seconds and memory of its own."""
        self.check_batch(inputs)
        with self.permits.hold(inputs):
            return await asyncio.to_thread(work, *args)

    async def chunk_windows(
        self,
        model: ServedModel,
        items: list[Item],
        chunking: Chunking | None,
        context: RequestContext,
    ) -> Windows | None:
        """`items` with each text longer than the model's window cut into windows (`chunking`), or
        None when chunking is off or no input needs it."""
        if (
            chunking is None
            or model.tokenizer is None
            or not has_long_texts(items, None, model.max_length)
        ):
            return None
        started = time.perf_counter()
        with stage("chunk long texts", inputs=len(items)):
            windows = await asyncio.to_thread(
                split_items, model.tokenizer, items, model.max_length, chunking
            )
        context.chunked(windows.counts, time.perf_counter() - started)
        if len(windows.items) == len(items):
            return None
        if any(isinstance(item, PromptedText) for item in items):
            raise validation(
                f"model `{model.name}` leaves its prompt out of the pooling (include_prompt: false), "
                "which chunked inputs cannot do; send this input without chunking or without a prompt"
            )
        return windows

    async def dense(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        normalize: bool,
        dimensions: int | None,
        context: RequestContext,
        chunking: Chunking | None = None,
    ) -> Embeddings:
        """Pooled vectors; `dimensions` keeps the first N, then (re-)normalises when asked. With
        `chunking`, a long text's vector is its windows' mean weighted by tokens (see `chunking`)."""
        self.check(items)
        self.check_dimensions(model, dimensions)
        windows = await self.chunk_windows(model, items, chunking, context)
        run, truncation = (windows.items, WINDOW_TRUNCATION) if windows else (items, truncation)
        with self.permits.hold(len(run)):
            if (
                not normalize
                and model.normalize
                and contract.SENTENCE_EMBEDDING in model.encode_outputs
            ):
                # Triton's pool stage normalises: take the graph's own pooled vector before it does
                result = await self.engine.infer(
                    Inference(model, run, None, truncation, (contract.SENTENCE_EMBEDDING,), True),
                    context,
                )
                vectors = result.outputs[contract.SENTENCE_EMBEDDING]
            elif not normalize and model.normalize:  # the same, pooling the raw encoder output here
                result = await self.engine.infer(
                    Inference(model, run, None, truncation, (contract.LAST_HIDDEN_STATE,), True),
                    context,
                )
                vectors = POOL_STAGE.pool_tokens(
                    result.outputs[contract.LAST_HIDDEN_STATE], result.mask, model.pooling
                )
            else:
                result = await self.engine.infer(
                    Inference(model, run, None, truncation, (contract.DENSE, contract.NUM_TOKENS)),
                    context,
                )
                vectors = result.outputs[contract.DENSE]
        num_tokens = result.num_tokens
        if windows:
            vectors, num_tokens = (
                mean_by_tokens(vectors, num_tokens, windows),
                summed(num_tokens, windows),
            )
        if dimensions is not None:
            vectors = vectors[:, :dimensions]
        if normalize and (dimensions is not None or not model.normalize or windows):
            vectors = POOL_STAGE.l2_normalize(vectors)
        return Embeddings(np.ascontiguousarray(vectors, dtype=np.float32), num_tokens)

    async def sparse(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        context: RequestContext,
    ) -> Embeddings:
        """Per input, its non-zero vocabulary ids (ascending) and their weights."""
        self.check(items)
        with self.permits.hold(len(items)):
            outputs = (contract.SPARSE_IDS, contract.SPARSE_WEIGHTS, contract.NUM_TOKENS)
            result = await self.engine.infer(
                Inference(model, items, None, truncation, outputs), context
            )
        ids, weights = result.outputs[contract.SPARSE_IDS], result.outputs[contract.SPARSE_WEIGHTS]
        keep = ids >= 0
        return Embeddings(
            [ids[i][keep[i]] for i in range(len(items))],
            result.num_tokens,
            [weights[i][keep[i]] for i in range(len(items))],
        )

    async def colbert(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        context: RequestContext,
        query: bool = False,
    ) -> Embeddings:
        """Multi-vectors: bge-m3's `num_tokens - 1` per input (CLS dropped; queries and documents
        alike), a late-interaction model's its kept tokens' (`late_vectors`)."""
        self.check(items)
        if model.task is Task.LATE:
            return await self.late_vectors(
                model, items, truncation=truncation, query=query, context=context
            )
        with self.permits.hold(len(items)):
            result = await self.engine.infer(
                Inference(model, items, None, truncation, (contract.COLBERT, contract.NUM_TOKENS)),
                context,
            )
        vectors = result.outputs[contract.COLBERT]
        return Embeddings(
            [vectors[i, : n - 1] for i, n in enumerate(result.num_tokens.tolist())],
            result.num_tokens,
        )

    async def late_vectors(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        query: bool,
        context: RequestContext,
    ) -> Embeddings:
        """A late-interaction model's vectors, as PyLate's `encode(is_query=query)`: documents go as
        any model's inputs (the tokenizer frames them), queries framed here by the model's query
        tokenizer, always cut (and expanded) to its query length as PyLate cuts them."""
        rows = None
        if query:
            framing = model.queries
            if framing is None:
                raise GatewayError(
                    ErrorKind.TOKENIZER,
                    f"model `{model.name}` has no query tokenizer beside its tokenizer file (the "
                    "gateway's log names it); its queries cannot be framed",
                )
            if not all(isinstance(item, str) for item in items):
                raise validation(
                    f"model `{model.name}` frames each query with its own tokens: give queries as "
                    "texts, not token ids"
                )
            texts = [contract.read_text(str(item), model.strip_texts) for item in items]
            rows = await self.tokenizer_work(len(texts), query_rows, framing, texts)
        with self.permits.hold(len(items)):
            result = await self.engine.infer(
                Inference(
                    model,
                    items,
                    None,
                    truncation,
                    (contract.COLBERT, contract.NUM_TOKENS),
                    rows=rows,
                ),
                context,
            )
        vectors = result.outputs[contract.COLBERT]
        # the pool stage moves each row's vectors to its front; zero rows follow them
        counts = np.any(vectors != 0, axis=2).sum(axis=1).tolist()
        return Embeddings([vectors[i, :n] for i, n in enumerate(counts)], result.num_tokens)

    async def hidden(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        context: RequestContext,
    ) -> Embeddings:
        """The encoder's last hidden state, one vector per token, no pooling; a late-interaction
        model's per-token vectors are its documents' multi-vectors."""
        if model.task is Task.LATE:
            return await self.colbert(model, items, truncation=truncation, context=context)
        self.check(items)
        with self.permits.hold(len(items)):
            result = await self.engine.infer(
                Inference(model, items, None, truncation, (contract.LAST_HIDDEN_STATE,), True),
                context,
            )
        hidden = result.outputs[contract.LAST_HIDDEN_STATE]
        return Embeddings(
            [hidden[i, :n] for i, n in enumerate(result.num_tokens.tolist())], result.num_tokens
        )

    async def late_chunks(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        normalize: bool,
        dimensions: int | None,
        context: RequestContext,
    ) -> Embeddings:
        """Jina's late chunking: `items`, chunks of one document in order, read in one pass, each
        chunk's vector the mean of its own tokens' states (L2-normalised when `normalize`), so a
        chunk's vector carries what the chunks around it say. Models that do not pool their vector
        from those states alone are refused by name."""
        self.check(items)
        self.check_dimensions(model, dimensions)
        refusal = late_chunking_refusal(model)
        if refusal is not None:
            raise validation(f"`late_chunking` on model `{model.name}`: {refusal}")
        if not all(type(item) is str for item in items):  # prompted texts and token ids alike
            raise validation(
                "`late_chunking` reads the inputs as one document: give plain texts, without a "
                "prompt per input or token ids"
            )
        texts = cast("list[str]", items)
        joined = await self.tokenizer_work(
            len(texts), joined_chunks, model.require_tokenizer(), texts, model.max_length
        )
        with self.permits.hold(len(texts)):
            result = await self.engine.infer(
                Inference(
                    model,
                    [joined.ids],
                    None,
                    Truncation(False, "right"),
                    (contract.LAST_HIDDEN_STATE,),
                    True,
                ),
                context,
            )
        states = result.outputs[contract.LAST_HIDDEN_STATE][0]
        vectors = np.stack([states[span.start : span.stop].mean(axis=0) for span in joined.spans])
        # each chunk counts its own tokens; the first also the special tokens around them all
        counts = np.asarray([len(span) for span in joined.spans], dtype=np.int64)
        counts[0] += len(joined.ids) - int(counts.sum())
        if dimensions is not None:
            vectors = vectors[:, :dimensions]
        if normalize:
            vectors = POOL_STAGE.l2_normalize(vectors)
        return Embeddings(np.ascontiguousarray(vectors, dtype=np.float32), counts)

    async def m3(
        self,
        model: ServedModel,
        items: list[Item],
        *,
        truncation: Truncation,
        wanted: frozenset[str],
        context: RequestContext,
        chunking: Chunking | None = None,
    ) -> M3Rows:
        """Any of bge-m3's dense, sparse and ColBERT outputs (`contract` names) for `items`, from one
        forward pass: one Triton call per chunk, whatever the subset. With `chunking`, a long
        text's windows combine as `chunking` says."""
        self.check(items)
        windows = await self.chunk_windows(model, items, chunking, context)
        run, truncation = (windows.items, WINDOW_TRUNCATION) if windows else (items, truncation)
        outputs = (*(name for name in M3_OUTPUTS if name in wanted), contract.NUM_TOKENS)
        with self.permits.hold(len(run)):
            result = await self.engine.infer(
                Inference(model, run, None, truncation, outputs), context
            )
        got, counts = result.outputs, result.num_tokens.tolist()
        ids = got.get(contract.SPARSE_IDS)
        keep = ids >= 0 if ids is not None else None
        rows = M3Rows(
            dense=np.ascontiguousarray(got[contract.DENSE], dtype=np.float32)
            if contract.DENSE in got
            else None,
            sparse_ids=[ids[i][keep[i]] for i in range(len(run))]
            if ids is not None and keep is not None
            else None,
            sparse_weights=[got[contract.SPARSE_WEIGHTS][i][keep[i]] for i in range(len(run))]
            if keep is not None
            else None,
            colbert=[got[contract.COLBERT][i, : n - 1] for i, n in enumerate(counts)]
            if contract.COLBERT in got
            else None,
            num_tokens=result.num_tokens,
        )
        if not windows:
            return rows
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

    async def relevance(
        self,
        model: ServedModel,
        query: str,
        texts: list[str],
        *,
        truncation: Truncation,
        raw_scores: bool,
        context: RequestContext,
        weights: Sequence[float] | None = None,
        instruction: str | None = None,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """One score per text against `query` and the tokens read per text: a cross-encoder's
        (sigmoid, or the logit with `raw_scores`), or for bge-m3 the `colbert+sparse+dense` hybrid
        of `hybrid.scores` (query and texts encoded in one call; the query's tokens are counted
        with the first text's). A late-interaction model scores by `late_score`, the query encoded as
        a query. `instruction` is an LLM reranker's, in place of its own. A hybrid or MaxSim score
        has no activation: `raw_scores` leaves it as it is."""
        if model.task is Task.LATE:
            refused = (
                "`weights` applies to bge-m3 models"
                if weights is not None
                else "`instruction` applies to LLM rerankers"
                if instruction is not None
                else None
            )
            if refused:
                raise validation(f"model `{model.name}` is a late-interaction model: {refused}")
            return await self._late_relevance(model, query, texts, truncation, context)
        if not model.is_m3:
            if weights is not None:
                raise validation(
                    f"`weights` applies to bge-m3 models; `{model.name}` is a cross-encoder"
                )
            values, tokens = await self.scores(
                model,
                [query] * len(texts),
                list(texts),
                truncation=truncation,
                raw_scores=raw_scores,
                context=context,
                instruction=instruction,
            )
            return values[:, 0], tokens
        if instruction is not None:
            raise validation(
                f"`instruction` applies to LLM rerankers; model `{model.name}` is bge-m3"
            )
        rows = await self.m3(
            model,
            [query, *texts],
            truncation=truncation,
            wanted=frozenset(M3_OUTPUTS),
            context=context,
        )
        try:
            hybrid = scores_of(rows, DEFAULT_WEIGHTS if weights is None else weights)[HYBRID]
        except ValueError as exc:
            raise validation(str(exc)) from None
        tokens = rows.num_tokens[1:].copy()
        if len(tokens):
            tokens[0] += rows.num_tokens[0]
        return np.asarray(hybrid, dtype=np.float32), tokens

    async def _late_relevance(
        self,
        model: ServedModel,
        query: str,
        texts: list[str],
        truncation: Truncation,
        context: RequestContext,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """MaxSim of the query's vectors against each text's own: PyLate's `colbert_scores` of each
        pair, whatever else the request holds."""
        asked, documents = await gather(
            [
                self.colbert(model, [query], truncation=truncation, context=context, query=True),
                self.colbert(model, list(texts), truncation=truncation, context=context),
            ]
        )
        scores = [late_score(asked.rows[0], document) for document in documents.rows]
        tokens = documents.num_tokens.copy()
        if len(tokens):
            tokens[0] += asked.num_tokens[0]
        return np.asarray(scores, dtype=np.float32), tokens

    async def _check_room(
        self, model: ServedModel, queries: list[str], instruction: str | None
    ) -> None:
        """Refuse queries that leave an LLM reranker no room for the document: its prompt is cut
        from the end, as the model card cuts it, and would score every document alike."""
        tokenizer = model.require_tokenizer()
        heads = {model.pair_template.text(query, "", instruction) for query in queries}
        if not any(may_fill(tokenizer, head, model.max_length) for head in heads):
            return
        count = await asyncio.to_thread(filling_tokens, tokenizer, heads, model.max_length)
        if count is not None:
            raise validation(
                f"the query and instruction take {count} tokens of model `{model.name}`'s "
                f"{model.max_length}, leaving none for the document; shorten the query"
            )

    async def scores(
        self,
        model: ServedModel,
        texts: list[str],
        pairs: Sequence[str | None],
        *,
        truncation: Truncation,
        raw_scores: bool,
        context: RequestContext,
        instruction: str | None = None,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """[n, labels] scores (or logits) and token counts; single texts and pairs may be mixed. An LLM
        reranker scores pairs only, each written into its prompt with `instruction` (or its own)."""
        self.check(texts)
        if any(pair == "" for pair in pairs):
            raise validation("`inputs` cannot be empty")
        if model.pair_template is not None:
            if any(pair is None for pair in pairs):
                raise validation(
                    f"model `{model.name}` is an LLM reranker: it scores (query, document) pairs"
                )
            await self._check_room(model, texts, instruction)
            texts = [
                model.pair_template.text(text, cast(str, pair), instruction)
                for text, pair in zip(texts, pairs)
            ]
            pairs = [None] * len(texts)
        elif instruction is not None:
            raise validation(
                f"`instruction` applies to LLM rerankers; model `{model.name}` is a cross-encoder"
            )
        singles = [i for i, pair in enumerate(pairs) if pair is None]
        doubles = [i for i, pair in enumerate(pairs) if pair is not None]
        if doubles and not model.takes_pairs:
            raise validation(
                f"model `{model.name}` classifies single texts; give one text per input"
            )
        name = contract.LOGITS if raw_scores else contract.SCORES
        groups = [
            (rows, group_pairs)
            for rows, group_pairs in ((singles, None), (doubles, [pairs[i] for i in doubles]))
            if rows
        ]
        with self.permits.hold(len(texts)):
            results = await gather(
                [
                    self.engine.infer(
                        Inference(
                            model,
                            [texts[i] for i in rows],
                            cast("list[str] | None", group_pairs),  # `doubles`: no None
                            truncation,
                            (name, contract.NUM_TOKENS),
                        ),
                        context,
                    )
                    for rows, group_pairs in groups
                ]
            )
        width = results[0].outputs[name].shape[1]
        values, tokens = (
            np.zeros((len(texts), width), dtype=np.float32),
            np.zeros(len(texts), dtype=np.int64),
        )
        for (rows, _), result in zip(groups, results):
            values[rows], tokens[rows] = result.outputs[name], result.num_tokens
        return values, tokens
