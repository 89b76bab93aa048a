"""Request -> Triton -> result, with no HTTP in sight.

Two ways to Triton. The text path sends UTF-8 texts to the ensemble `<name>`: one call, Triton
tokenizes (right truncation at the model's max length). The token path sends token ids the
gateway produced (see `tokenization`) to `<name>_encode`, then the encoder outputs to
`<name>_pool` (a fused model takes the token ids itself: one call), so left truncation, token-id
inputs and truncated pairs are pooled by the same stage code as everything else. The token path
is taken only when the text path would give a different answer; a request whose inputs all fit
goes the text path even when the gateway had to count its tokens. Texts longer than the model's
window are first cut to what it reads (`tokenization.bound_texts`), so that neither path tokenizes
a long text once per input or pair. How a model's calls are cut, merged across requests and
bounded in Triton is its `dispatch.ModelDispatch`'s: the chunks go to Triton concurrently, where
the dynamic batcher merges them again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from prensa.gateway.backend import Backend
from prensa.gateway.chunking import (
    Chunking,
    Windows,
    concatenated,
    max_per_id,
    mean_by_tokens,
    split_items,
    summed,
)
from prensa.gateway.dispatch import Dispatcher, ModelDispatch
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.hybrid import DEFAULT_WEIGHTS, HYBRID, M3Rows
from prensa.gateway.hybrid import scores as scores_of
from prensa.gateway.limits import Permits
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.models import ServedModel
from prensa.gateway.request_context import RequestContext
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tokenization import (
    Item,
    PromptedText,
    TokenRows,
    Truncation,
    bound_texts,
    filling_tokens,
    has_long_texts,
    may_fill,
    tokenize_items,
)
from prensa.gateway.tracing import stage
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
class Inferred:
    outputs: dict[str, npt.NDArray[Any]]
    num_tokens: npt.NDArray[Any]  # [n], special tokens included
    mask: npt.NDArray[Any] | None = None  # [n, t], encoder-only calls


@dataclass
class Embeddings:
    # [n, dim], or one array per input (sparse ids, token vectors)
    rows: list[npt.NDArray[Any]] | npt.NDArray[Any]
    num_tokens: npt.NDArray[Any]  # [n], special tokens included
    # sparse only: the weight of each id in `rows`
    weights: list[npt.NDArray[Any]] = field(default_factory=list)


def concat_rows(arrays: list[npt.NDArray[Any]], pad: float) -> npt.NDArray[Any]:
    """Concatenate chunk outputs whose axis 1 (tokens, sparse terms) may differ in width."""
    if len(arrays) == 1:
        return arrays[0]
    if arrays[0].ndim > 1:
        width = max(a.shape[1] for a in arrays)
        arrays = [
            np.pad(
                a, [(0, 0), (0, width - a.shape[1])] + [(0, 0)] * (a.ndim - 2), constant_values=pad
            )
            for a in arrays
        ]
    return np.concatenate(arrays)


async def gather(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """`asyncio.gather`, but a lone call (one chunk, one group: most requests) runs in this task
    instead of a new one."""
    return [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)


@dataclass(frozen=True)
class Inference:
    """What one request asks of Triton: its inputs (and their `pairs`), their truncation and the
    outputs wanted; `encoder_only` asks for `<name>_encode`'s outputs instead of the pooled ones.
    Built once per request (per group of a mixed one), it is what every step below reads."""

    model: ServedModel
    items: list[Item]
    pairs: list[str] | None
    truncation: Truncation
    outputs: tuple[str, ...]
    encoder_only: bool = False

    def prompt_tokens(self) -> list[int]:
        """Leading tokens the pooling leaves out, per input (none for the models that pool their
        prompts, nearly all: no pass over the inputs then)."""
        if self.model.include_prompt:
            return []
        return [
            self.model.prompt_length(item.prompt) if isinstance(item, PromptedText) else 0
            for item in self.items
        ]


def needs_token_ids(inference: Inference, prompt_tokens: Sequence[int]) -> bool:
    """Whether only the token path answers: encoder outputs, token-id inputs, a reranker's lone
    texts, or prompts the pooling leaves out, none of which the ensemble's text input can carry."""
    return (
        inference.encoder_only
        or not all(isinstance(item, str) for item in inference.items)
        or (inference.pairs is None and inference.model.needs_pairs)
        or any(prompt_tokens)
    )


def gateway_tokenizes(inference: Inference, needs_tokens: bool) -> bool:
    """Whether the gateway tokenizes: for the token path, or because Triton's tokenize stage could
    answer otherwise (it truncates right at the model's max length and refuses nothing)."""
    truncation = inference.truncation
    return (
        needs_tokens
        or not truncation.enabled
        or truncation.direction == "left"
        or truncation.window is not None
    )


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


class Service:
    def __init__(
        self, settings: GatewaySettings, client: Backend, metrics: GatewayMetrics, permits: Permits
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.permits = permits
        # cut, merge, bound: per model
        self.dispatch = Dispatcher(settings, client, metrics.merged_calls.observe)

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

    async def _token_call(
        self, inference: Inference, rows: TokenRows, request_id: str
    ) -> dict[str, npt.NDArray[Any]]:
        model, outputs = inference.model, inference.outputs
        ids, mask, types = rows.padded(model.pad_id)
        tokens = {
            contract.INPUT_IDS: ids,
            contract.ATTENTION_MASK: mask,
            contract.TOKEN_TYPE_IDS: types,
        }
        encoder_inputs = {name: tokens[name] for name in model.encode_inputs}
        if inference.encoder_only or model.fused:  # a fused model pools too: one call
            return await self.client.infer(model.encode_model, encoder_inputs, outputs, request_id)
        encoded = await self.client.infer(
            model.encode_model, encoder_inputs, model.encode_outputs, request_id
        )
        available = {**tokens, **encoded}
        return await self.client.infer(
            model.pool_model, {n: available[n] for n in model.pool_inputs}, outputs, request_id
        )

    async def infer(self, inference: Inference, context: RequestContext) -> Inferred:
        """Run `inference` through Triton: the text path or the token path (see the module's
        docstring), its calls cut and merged by the model's dispatch."""
        model = inference.model
        context.began(model.name, inference.items, inference.pairs)
        # known here, before a cut makes new texts
        prompt_tokens = inference.prompt_tokens()
        window = inference.truncation.window
        if window is not None and max(prompt_tokens, default=0) >= window:
            raise validation(
                f"the prompt takes {max(prompt_tokens)} tokens, and the inputs are cut to {window}: "
                "no token of the text would be pooled"
            )
        if (
            inference.truncation.enabled
            and model.tokenizer is not None
            and has_long_texts(
                inference.items, inference.pairs, inference.truncation.max_length(model.max_length)
            )
        ):
            inference = await self._bounded(inference, context)
        needs_tokens = needs_token_ids(inference, prompt_tokens)
        rows = (
            await self._tokenized(inference, prompt_tokens, context)
            if gateway_tokenizes(inference, needs_tokens)
            else None
        )
        token_rows = rows if rows is not None and (needs_tokens or rows.cut) else None
        dispatch = self.dispatch(model)
        chunks = dispatch.chunks(len(inference.items))
        merged, seconds = await self._calls(inference, dispatch, token_rows, chunks, context)
        if inference.encoder_only:
            assert rows is not None  # `encoder_only` needs tokens
            num_tokens = np.asarray(rows.lengths, dtype=np.int64)
        else:
            num_tokens = merged[contract.NUM_TOKENS].reshape(-1).astype(np.int64)
        self._observe_calls(chunks, num_tokens, seconds)
        context.inferred(seconds, int(num_tokens.sum()))
        if not inference.encoder_only:
            return Inferred(merged, num_tokens)
        width = merged[inference.outputs[0]].shape[1]
        mask = (np.arange(width)[None, :] < num_tokens[:, None]).astype(np.int64)
        return Inferred(merged, num_tokens, contract.mark_prompts(mask, prompt_tokens))

    async def _bounded(self, inference: Inference, context: RequestContext) -> Inference:
        """Texts longer than the model's window cut to what it reads, before anything (or Triton's
        tokenize stage) tokenizes a text per input or per pair."""
        started = time.perf_counter()
        with stage("cut long texts", inputs=len(inference.items)):
            items, pairs = await asyncio.to_thread(
                bound_texts,
                inference.model.require_tokenizer(),
                inference.items,
                inference.pairs,
                inference.truncation.max_length(inference.model.max_length),
                inference.truncation.direction,
            )
        context.tokenized(time.perf_counter() - started)
        return replace(inference, items=items, pairs=pairs)

    async def _tokenized(
        self, inference: Inference, prompt_tokens: list[int], context: RequestContext
    ) -> TokenRows:
        """The gateway's own tokens of the inputs (and pairs), as the tokenize stage would make them."""
        model, items = inference.model, inference.items
        tokenizer = (
            model.require_tokenizer() if any(isinstance(i, str) for i in items) else model.tokenizer
        )
        started = time.perf_counter()
        with stage("tokenize", inputs=len(items)):
            rows = await asyncio.to_thread(
                tokenize_items,
                tokenizer,
                items,
                inference.pairs,
                inference.truncation.max_length(model.max_length),
                inference.truncation,
                model.token_id_limit,
                model.pair_truncation,
            )
            # an LLM reranker's filled-in pairs, framed by its prompt
            if model.pair_template is not None:
                rows = rows.framed(*model.template_edges)
            if any(prompt_tokens):
                rows.prompt_tokens = prompt_tokens
        elapsed = time.perf_counter() - started
        context.tokenized(elapsed)
        self.metrics.tokenization_duration.observe(elapsed)
        return rows

    async def _calls(
        self,
        inference: Inference,
        dispatch: ModelDispatch,
        rows: TokenRows | None,
        chunks: list[slice],
        context: RequestContext,
    ) -> tuple[dict[str, npt.NDArray[Any]], float]:
        """One Triton call per chunk, concurrently: token ids when `rows` are given, else texts to the
        model's dispatch (merged with other requests'); their outputs concatenated in order, and the
        seconds they took."""
        started, outputs, pairs = time.perf_counter(), inference.outputs, inference.pairs
        if (queued := context.dispatched(started)) is not None:
            self.metrics.queue_duration.observe(queued)
        if rows is not None:
            calls = [
                self._token_call(inference, rows.select(c), context.request_id) for c in chunks
            ]
        else:
            texts = cast("list[str]", inference.items)  # no token ids: every input is a text
            calls = [
                dispatch.texts(texts[c], pairs[c] if pairs else None, outputs, context.request_id)
                for c in chunks
            ]
        parts = await gather(calls)
        elapsed = time.perf_counter() - started
        pads = {
            name: contract.SPARSE_PAD_ID if name == contract.SPARSE_IDS else 0 for name in outputs
        }
        return {
            name: concat_rows([part[name] for part in parts], pads[name]) for name in outputs
        }, elapsed

    def _observe_calls(
        self, chunks: list[slice], num_tokens: npt.NDArray[Any], seconds: float
    ) -> None:
        """What one dispatch's calls took and carried: seconds, rows and tokens per call, tokens per input."""
        self.metrics.inference_duration.observe(seconds)
        for chunk in chunks:
            self.metrics.call_size.observe(len(num_tokens[chunk]))
            self.metrics.call_tokens.observe(int(num_tokens[chunk].sum()))
        for count in num_tokens.tolist():
            self.metrics.input_length.observe(count)

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
        truncation: Truncation,
        normalize: bool,
        dimensions: int | None,
        context: RequestContext,
        chunking: Chunking | None = None,
    ) -> Embeddings:
        """Pooled vectors; `dimensions` keeps the first N, then (re-)normalises when asked. With
        `chunking`, a long text's vector is its windows' mean weighted by tokens (see `chunking`)."""
        self.check(items)
        dim = model.dense_dim or 0
        if dimensions is not None and dimensions <= 0:
            raise validation("`dimensions` should be positive")
        if dimensions is not None and dimensions > dim:
            raise validation(
                f"`dimensions` should be at most the model's embedding size {dim}, got {dimensions}"
            )
        if dimensions is not None and dimensions != dim:
            self.check_matryoshka(model, dimensions)
        windows = await self.chunk_windows(model, items, chunking, context)
        run, truncation = (windows.items, WINDOW_TRUNCATION) if windows else (items, truncation)
        with self.permits.hold(len(run)):
            if (
                not normalize
                and model.normalize
                and contract.SENTENCE_EMBEDDING in model.encode_outputs
            ):
                # Triton's pool stage normalises: take the graph's own pooled vector before it does
                result = await self.infer(
                    Inference(model, run, None, truncation, (contract.SENTENCE_EMBEDDING,), True),
                    context,
                )
                vectors = result.outputs[contract.SENTENCE_EMBEDDING]
            elif not normalize and model.normalize:  # the same, pooling the raw encoder output here
                result = await self.infer(
                    Inference(model, run, None, truncation, (contract.LAST_HIDDEN_STATE,), True),
                    context,
                )
                vectors = POOL_STAGE.pool_tokens(
                    result.outputs[contract.LAST_HIDDEN_STATE], result.mask, model.pooling
                )
            else:
                result = await self.infer(
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
        self, model: ServedModel, items: list[Item], truncation: Truncation, context: RequestContext
    ) -> Embeddings:
        """Per input, its non-zero vocabulary ids (ascending) and their weights."""
        self.check(items)
        with self.permits.hold(len(items)):
            outputs = (contract.SPARSE_IDS, contract.SPARSE_WEIGHTS, contract.NUM_TOKENS)
            result = await self.infer(Inference(model, items, None, truncation, outputs), context)
        ids, weights = result.outputs[contract.SPARSE_IDS], result.outputs[contract.SPARSE_WEIGHTS]
        keep = ids >= 0
        return Embeddings(
            [ids[i][keep[i]] for i in range(len(items))],
            result.num_tokens,
            [weights[i][keep[i]] for i in range(len(items))],
        )

    async def colbert(
        self, model: ServedModel, items: list[Item], truncation: Truncation, context: RequestContext
    ) -> Embeddings:
        """bge-m3 multi-vectors: `num_tokens - 1` vectors per input (CLS dropped)."""
        self.check(items)
        with self.permits.hold(len(items)):
            result = await self.infer(
                Inference(model, items, None, truncation, (contract.COLBERT, contract.NUM_TOKENS)),
                context,
            )
        vectors = result.outputs[contract.COLBERT]
        return Embeddings(
            [vectors[i, : n - 1] for i, n in enumerate(result.num_tokens.tolist())],
            result.num_tokens,
        )

    async def hidden(
        self, model: ServedModel, items: list[Item], truncation: Truncation, context: RequestContext
    ) -> Embeddings:
        """The encoder's last hidden state, one vector per token, no pooling."""
        self.check(items)
        with self.permits.hold(len(items)):
            result = await self.infer(
                Inference(model, items, None, truncation, (contract.LAST_HIDDEN_STATE,), True),
                context,
            )
        hidden = result.outputs[contract.LAST_HIDDEN_STATE]
        return Embeddings(
            [hidden[i, :n] for i, n in enumerate(result.num_tokens.tolist())], result.num_tokens
        )

    async def m3(
        self,
        model: ServedModel,
        items: list[Item],
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
            result = await self.infer(Inference(model, run, None, truncation, outputs), context)
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
        truncation: Truncation,
        raw_scores: bool,
        context: RequestContext,
        weights: Sequence[float] | None = None,
        instruction: str | None = None,
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """One score per text against `query` and the tokens read per text: a cross-encoder's
        (sigmoid, or the logit with `raw_scores`), or for bge-m3 the `colbert+sparse+dense` hybrid
        of `hybrid.scores` (query and texts encoded in one call; the query's tokens are counted
        with the first text's). `instruction` is an LLM reranker's, in place of its own."""
        if not model.is_m3:
            if weights is not None:
                raise validation(
                    f"`weights` applies to bge-m3 models; `{model.name}` is a cross-encoder"
                )
            values, tokens = await self.scores(
                model,
                [query] * len(texts),
                list(texts),
                truncation,
                raw_scores,
                context,
                instruction,
            )
            return values[:, 0], tokens
        if instruction is not None:
            raise validation(
                f"`instruction` applies to LLM rerankers; model `{model.name}` is bge-m3"
            )
        if raw_scores:
            raise validation(
                f"model `{model.name}` is bge-m3: its hybrid score has no activation to leave out"
            )
        rows = await self.m3(model, [query, *texts], truncation, frozenset(M3_OUTPUTS), context)
        try:
            hybrid = scores_of(rows, DEFAULT_WEIGHTS if weights is None else weights)[HYBRID]
        except ValueError as exc:
            raise validation(str(exc)) from None
        tokens = rows.num_tokens[1:].copy()
        if len(tokens):
            tokens[0] += rows.num_tokens[0]
        return np.asarray(hybrid, dtype=np.float32), tokens

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
                    self.infer(
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
