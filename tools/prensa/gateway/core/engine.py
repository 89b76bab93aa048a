"""Request -> Triton -> result, with no HTTP in sight: the engine's one `infer`, which every task of
`service` runs through.

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
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.dispatch import Dispatcher, ModelDispatch
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import (
    Item,
    PromptedText,
    TokenRows,
    Truncation,
    bound_texts,
    has_long_texts,
    read_item,
    tokenize_items,
)
from prensa.gateway.errors import validation
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import stage
from prensa.stages import contract

T = TypeVar("T")


@dataclass
class Inferred:
    outputs: dict[str, npt.NDArray[Any]]
    num_tokens: npt.NDArray[Any]  # [n], special tokens included
    mask: npt.NDArray[Any] | None = None  # [n, t], encoder-only calls


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


@dataclass(frozen=True, kw_only=True)
class Inference:
    """What one request asks of Triton: its inputs (and their `pairs`), their truncation and the
    outputs wanted; `encoder_only` asks for `<name>_encode`'s outputs instead of the pooled ones.
    Built once per request (per group of a mixed one), it is what every step below reads."""

    model: ServedModel
    items: list[Item]
    pairs: list[str] | None = None
    truncation: Truncation
    outputs: tuple[str, ...]
    encoder_only: bool = False
    # token rows the caller framed itself (a late-interaction model's queries): sent as they are
    rows: TokenRows | None = None

    def prompt_tokens(self) -> list[int]:
        """Leading tokens the pooling leaves out, per input (none for the models that pool their
        prompts, nearly all: no pass over the inputs then)."""
        if self.model.include_prompt:
            return []
        return [
            self.model.prompt_length(item.prompt) if isinstance(item, PromptedText) else 0
            for item in self.items
        ]


def read_inputs(inference: Inference) -> Inference:
    """`inference` with its texts as the model's reference library reads them (`contract.STRIP_TEXTS`)."""
    strip = inference.model.strip_texts
    pairs = inference.pairs
    return replace(
        inference,
        items=[read_item(item, strip) for item in inference.items],
        pairs=[contract.read_text(pair, strip) for pair in pairs] if pairs is not None else None,
    )


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


class Engine:
    """Runs an `Inference` through a backend: the text path or the token path, each model's calls
    cut, merged and bounded by its dispatch, and what they carried observed."""

    def __init__(self, settings: GatewaySettings, client: Backend, metrics: GatewayMetrics) -> None:
        self.client = client
        self.metrics = metrics
        # cut, merge, bound: per model
        self.dispatch = Dispatcher(settings, client, metrics.merged_calls.observe)

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
        if inference.rows is not None:
            return await self._framed(inference, inference.rows, context)
        if model.strip_texts:  # both paths then cut and tokenize what the model reads
            inference = read_inputs(inference)
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
        chunks = dispatch.chunks(len(inference.items), context.priority, token_rows is None)
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

    async def _framed(
        self, inference: Inference, rows: TokenRows, context: RequestContext
    ) -> Inferred:
        """`infer` for token rows the caller framed: the token path, no cut or tokenizing here."""
        dispatch = self.dispatch(inference.model)
        chunks = dispatch.chunks(len(rows.ids), context.priority, paced=False)
        merged, seconds = await self._calls(inference, dispatch, rows, chunks, context)
        num_tokens = merged[contract.NUM_TOKENS].reshape(-1).astype(np.int64)
        self._observe_calls(chunks, num_tokens, seconds)
        context.inferred(seconds, int(num_tokens.sum()))
        return Inferred(merged, num_tokens)

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
            if model.prompted is not None:
                rows = rows.framed(model.prompted.prefix, model.prompted.suffix)
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
                dispatch.texts(
                    texts[c],
                    pairs[c] if pairs else None,
                    outputs,
                    context.request_id,
                    context.priority,
                    context.client,
                )
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
