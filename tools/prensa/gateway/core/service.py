"""The gateway's work, with no HTTP in sight: `Service.run` is the one template every operation
(`asks`) runs through, and `relevance` composes them into one score per document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from prensa.gateway.backends.base import Backend
from prensa.gateway.core.asks import (
    Ask,
    ColbertAsk,
    M3Ask,
    RelevanceAsk,
    Scores,
    ScoresAsk,
)
from prensa.gateway.core.chunking import Chunking, Windows, split_items
from prensa.gateway.core.engine import Engine, gather
from prensa.gateway.core.hybrid import DEFAULT_WEIGHTS, HYBRID, late_score
from prensa.gateway.core.hybrid import scores as scores_of
from prensa.gateway.core.limits import Permits
from prensa.gateway.core.registry import ModelUses, ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.tokenization import (
    Item,
    PromptedText,
    Truncation,
    filling_tokens,
    has_long_texts,
    may_fill,
    too_many_tokens,
)
from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.gateway.metrics import GatewayMetrics
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import stage
from prensa.layouts import Scoring

if TYPE_CHECKING:
    from prensa.gateway.core.shadow import Shadows

T = TypeVar("T")
R = TypeVar("R")


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
    """What every API's operations share: the request limits and truncation they are checked
    against, the template (`run`) each typed ask goes through to `engine.infer`, and relevance
    composed of asks."""

    def __init__(
        self,
        settings: GatewaySettings,
        client: Backend,
        metrics: GatewayMetrics,
        permits: Permits,
        uses: ModelUses | None = None,
        shadows: Shadows | None = None,
    ) -> None:
        """`uses`: the registry's count of each model's requests (a model being removed drains);
        `shadows`: where answers are copied to a model's shadow version."""
        self.settings = settings
        self.permits = permits
        self.uses = uses or ModelUses()
        self.shadows = shadows
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
        if model.prompted is not None:
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

    def tokenizable(self, model: ServedModel, texts: Sequence[Item]) -> list[str]:
        """`texts` for `/tokenize`, within the batch limit (422 first, as on every route) and not
        surely past the token limit: more characters than it holds of the model's longest token
        are refused before tokenizing."""
        self.check_batch(len(texts))
        limit = self.tokenize_limit(model)
        characters = sum(map(len, texts))
        if characters > limit * model.longest_token:
            raise too_many_tokens(
                limit,
                f"{characters} characters, and no token of the model is longer than "
                f"{model.longest_token}",
            )
        return cast("list[str]", list(texts))  # texts stay texts (`prompted` keeps their kind)

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

    async def run(self, ask: Ask[R], context: RequestContext) -> R:
        """`ask`'s answer: the batch's checks and the ask's own, its framing, the permits its
        inputs take (each window one), then Triton and the ask's finish."""
        if context.refusal is not None:
            raise validation(context.refusal)
        self.check(ask.items)
        ask.check(self)
        framed = await ask.frame(self, context)
        held = len(framed.windows.items) if framed.windows else len(ask.items)
        with self.permits.hold(held, context.priority), self.uses.hold(ask.model.name):
            results = await gather(
                [self.engine.infer(inference, context) for inference in ask.inferences(framed)]
            )
        answer = ask.finish(results, framed)
        if self.shadows is not None:
            self.shadows.copy(self, ask, answer, context)
        return answer

    async def relevance(self, ask: RelevanceAsk, context: RequestContext) -> Scores:
        """One score per text of `ask` and the tokens read per text (a query encoded apart counts
        with the first text's): a cross-encoder's or LLM reranker's through `ScoresAsk`, bge-m3's
        hybrid from one `M3Ask` of query and texts, a late model's MaxSim of `ColbertAsk`s."""
        refusal = ask.refusal()
        if refusal is not None:
            raise validation(refusal)
        model, query, texts, truncation = ask.model, ask.query, ask.texts, ask.truncation
        if model.layout.scoring is Scoring.MAXSIM:
            return await self._late_relevance(model, query, texts, truncation, context)
        if not model.is_m3:
            scored = await self.run(
                ScoresAsk(
                    model=model,
                    items=[query] * len(texts),
                    pairs=list(texts),
                    truncation=truncation,
                    raw_scores=ask.raw_scores,
                    instruction=ask.instruction,
                ),
                context,
            )
            return Scores(scored.values[:, 0], scored.num_tokens)
        rows = await self.run(
            M3Ask(model=model, items=[query, *texts], truncation=truncation), context
        )
        try:
            hybrid = scores_of(rows, DEFAULT_WEIGHTS if ask.weights is None else ask.weights)[
                HYBRID
            ]
        except ValueError as exc:
            raise validation(str(exc)) from None
        return Scores(np.asarray(hybrid, dtype=np.float32), with_query(rows.num_tokens))

    async def _late_relevance(
        self,
        model: ServedModel,
        query: str,
        texts: list[str],
        truncation: Truncation,
        context: RequestContext,
    ) -> Scores:
        """MaxSim of the query's vectors against each text's own: PyLate's `colbert_scores` of each
        pair, whatever else the request holds."""
        asked, documents = await gather(
            [
                self.run(
                    ColbertAsk(model=model, items=[query], truncation=truncation, query=True),
                    context,
                ),
                self.run(
                    ColbertAsk(model=model, items=list(texts), truncation=truncation), context
                ),
            ]
        )
        scores = [late_score(asked.rows[0], document) for document in documents.rows]
        return Scores(
            np.asarray(scores, dtype=np.float32),
            with_query(np.concatenate([asked.num_tokens, documents.num_tokens])),
        )

    async def check_room(
        self, model: ServedModel, queries: list[str], instruction: str | None
    ) -> None:
        """Refuse queries that leave an LLM reranker no room for the document: its prompt is cut
        from the end, as the model card cuts it, and would score every document alike."""
        tokenizer, prompted = model.require_tokenizer(), model.prompted
        assert prompted is not None  # asked of LLM rerankers only
        heads = {prompted.text(query, "", instruction) for query in queries}
        if not any(may_fill(tokenizer, head, model.max_length) for head in heads):
            return
        count = await asyncio.to_thread(filling_tokens, tokenizer, heads, model.max_length)
        if count is not None:
            raise validation(
                f"the query and instruction take {count} tokens of model `{model.name}`'s "
                f"{model.max_length}, leaving none for the document; shorten the query"
            )


def with_query(num_tokens: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Tokens per text when the first count is the query's: it joins the first text's."""
    tokens = num_tokens[1:].copy()
    if len(tokens):
        tokens[0] += num_tokens[0]
    return tokens
