"""One relevance score per document, as every rerank route asks it: documents cut to a number of
tokens first (Cohere's and vLLM's `max_tokens_per_doc`), or scored by windows, each document
keeping its best (Cohere's `max_chunks_per_doc`), or truncated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy.typing as npt

from prensa.gateway.core.chunking import best_of, chunk_texts, cut_texts
from prensa.gateway.core.registry import ServedModel
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.service import Service
from prensa.gateway.core.tokenization import Truncation


async def document_scores(
    service: Service,
    served: ServedModel,
    query: str,
    texts: list[str],
    truncation: Truncation,
    context: RequestContext,
    max_chunks: int | None = None,
    max_tokens: int | None = None,
    instruction: str | None = None,
    raw_scores: bool = False,
    weights: Sequence[float] | None = None,
) -> tuple[npt.NDArray[Any], int]:
    """One relevance score per document (sigmoid of the logit, or the logit with `raw_scores`; bge-m3's
    hybrid with `weights`) and the tokens read. `max_tokens` cuts documents first; `max_chunks`
    scores up to that many windows of a long document and keeps its best, instead of truncating it."""
    if max_tokens is not None and max_tokens < served.max_length:
        texts = await service.tokenizer_work(
            len(texts), cut_texts, served.require_tokenizer(), texts, max_tokens
        )
    if not max_chunks:
        values, tokens = await service.relevance(
            served,
            query,
            texts,
            truncation=truncation,
            raw_scores=raw_scores,
            context=context,
            weights=weights,
            instruction=instruction,
        )
        return values, int(tokens.sum())
    # Windows beside what precedes each document: the query, or an LLM reranker's prompt around it.
    beside = (
        served.pair_template.text(query, "", instruction)
        if served.pair_template is not None
        else query
    )
    windows = await service.tokenizer_work(
        len(texts),
        chunk_texts,
        served.require_tokenizer(),
        beside,
        texts,
        served.max_length,
        max_chunks,
        None if served.pair_template is not None else served.pair_truncation,
    )
    values, tokens = await service.relevance(
        served,
        query,
        cast("list[str]", windows.items),
        truncation=truncation,
        raw_scores=raw_scores,
        context=context,
        weights=weights,
        instruction=instruction,
    )
    return best_of(values, windows), int(tokens.sum())
