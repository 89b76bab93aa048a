"""One relevance score per document, as every rerank route asks it: documents cut to a number of
tokens first (Cohere's and vLLM's `max_tokens_per_doc`), or scored by windows, each document
keeping its best (Cohere's `max_chunks_per_doc`), or truncated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import numpy.typing as npt

from prensa.gateway.core.asks import RelevanceAsk
from prensa.gateway.core.chunking import best_of, chunk_texts, cut_texts
from prensa.gateway.core.request_context import RequestContext
from prensa.gateway.core.service import Service


async def document_scores(
    service: Service,
    ask: RelevanceAsk,
    context: RequestContext,
    *,
    max_chunks: int | None = None,
    max_tokens: int | None = None,
) -> tuple[npt.NDArray[Any], int]:
    """One relevance score per document of `ask` and the tokens read. `max_tokens` cuts documents
    first; `max_chunks` scores up to that many windows of a long document and keeps its best,
    instead of truncating it."""
    served, query, texts, instruction = ask.model, ask.query, ask.texts, ask.instruction
    if max_tokens is not None and max_tokens < served.max_length:
        texts = await service.tokenizer_work(
            len(texts), cut_texts, served.require_tokenizer(), texts, max_tokens
        )
    if not max_chunks:
        scored = await service.relevance(replace(ask, texts=texts), context)
        return scored.values, int(scored.num_tokens.sum())
    # Windows beside what precedes each document: the query, or an LLM reranker's prompt around it.
    prompted = served.prompted
    beside = prompted.text(query, "", instruction) if prompted is not None else query
    windows = await service.tokenizer_work(
        len(texts),
        chunk_texts,
        served.require_tokenizer(),
        beside,
        texts,
        served.max_length,
        max_chunks,
        None if served.prompted is not None else served.pair_truncation,
    )
    scored = await service.relevance(replace(ask, texts=cast("list[str]", windows.items)), context)
    return best_of(scored.values, windows), int(scored.num_tokens.sum())
