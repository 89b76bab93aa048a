"""Long inputs without silent loss: a text longer than the model's window is cut into windows of
tokens that overlap, every window is encoded beside the other inputs, and each input's windows
are combined again (as vLLM's chunked processing combines them).

A window is the span of the original text its tokens cover (the tokenizer's character offsets),
so windows travel Triton's text path like any other text and merge with other requests. Dense
vectors combine as their mean weighted by each window's tokens, re-normalised when the request
normalises; sparse weights as the maximum per vocabulary id (as bge-m3 and SPLADE already pool
tokens); ColBERT vectors are concatenated in order. Off by default: truncation, as TEI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from prensa.gateway.core.tokenization import Item, keep_tokens
from prensa.stages import contract

DEFAULT_OVERLAP = 32  # tokens two neighbouring windows share


@dataclass(frozen=True)
class Chunking:
    overlap: int = DEFAULT_OVERLAP


@dataclass(frozen=True)
class Windows:
    """Every input's windows, flattened in order, and how many each input took."""

    items: list[Item]
    counts: list[int]

    @cached_property
    def owners(self) -> npt.NDArray[np.int64]:
        """For each window, the index of its input."""
        return np.repeat(np.arange(len(self.counts)), self.counts)


def token_windows(
    tokenizer: Tokenizer, text: str, size: int, *, overlap: int = 0, count: int | None = None
) -> list[str]:
    """Consecutive spans of `text` of at most `size` tokens (special tokens not counted), cut at
    token boundaries by the tokenizer's character offsets, neighbours sharing `overlap` tokens; at
    most `count` of them (a long text is first cut to what they read); the text itself when it fits."""
    if count is not None:
        text = keep_tokens(tokenizer, text, size * count + 1, "right")
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    if len(offsets) <= size or size <= 0:
        return [text]
    stride = max(size - min(overlap, size - 1), 1)
    windows = []
    for start in range(0, len(offsets), stride):
        end = min(start + size, len(offsets))
        windows.append(text[offsets[start][0] : offsets[end - 1][1]])
        if end == len(offsets) or len(windows) == count:
            break
    return windows


def text_windows(tokenizer: Tokenizer, text: str, max_length: int, overlap: int) -> list[str]:
    """`text` as spans of at most `max_length` tokens with their special tokens, neighbours sharing
    `overlap` tokens; the text itself when it fits."""
    return token_windows(
        tokenizer, text, max_length - tokenizer.num_special_tokens_to_add(False), overlap=overlap
    )


def cut_texts(tokenizer: Tokenizer, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut after its first `max_tokens` tokens (Cohere's `max_tokens_per_doc`)."""
    return [token_windows(tokenizer, text, max(max_tokens, 1), count=1)[0] for text in texts]


def document_room(query_tokens: int, max_length: int, specials: int, pair_rule: str) -> int:
    """The most tokens a document keeps beside a query of `query_tokens` under `pair_rule`: what a
    window may hold and still be read whole."""
    room = max_length - specials
    size: int = contract.pair_lengths(query_tokens, room, room, pair_rule, max_length)[1]
    while (
        size > 1
        and contract.pair_lengths(query_tokens, size, room, pair_rule, max_length)[1] < size
    ):
        size -= 1
    return size


def chunk_texts(
    tokenizer: Tokenizer,
    query: str,
    texts: list[str],
    max_length: int,
    max_chunks: int,
    pair_rule: str | None,
) -> Windows:
    """Each text split into up to `max_chunks` windows that fit beside `query` in a pair of
    `max_length` tokens cut by `pair_rule` (Cohere's `max_chunks_per_doc`); a text that fits is one
    window. `pair_rule` None: `query` is an LLM reranker's prompt before the document, one text with it."""
    # a longer query leaves no more room
    query = keep_tokens(tokenizer, query, max_length + 1, "right")
    query_tokens = len(tokenizer.encode(query, add_special_tokens=False))
    room = (
        max_length - tokenizer.num_special_tokens_to_add(False) - query_tokens
        if pair_rule is None
        else document_room(
            query_tokens, max_length, tokenizer.num_special_tokens_to_add(True), pair_rule
        )
    )
    pieces = [token_windows(tokenizer, text, max(room, 1), count=max_chunks) for text in texts]
    return Windows(
        [window for windows in pieces for window in windows], [len(windows) for windows in pieces]
    )


def split_items(
    tokenizer: Tokenizer, items: Sequence[Item], max_length: int, chunking: Chunking
) -> Windows:
    """Texts longer than the model's window as several windows; token-id inputs as they are."""
    flat: list[Item] = []
    counts = []
    for item in items:
        pieces: list[Item] = (
            list(text_windows(tokenizer, item, max_length, chunking.overlap))
            if isinstance(item, str)
            else [item]
        )
        flat.extend(pieces)
        counts.append(len(pieces))
    return Windows(flat, counts)


def mean_by_tokens(
    vectors: npt.NDArray[Any], tokens: npt.NDArray[Any], windows: Windows
) -> npt.NDArray[Any]:
    """Each input's window vectors averaged, weighted by the windows' token counts."""
    weights = tokens.astype(np.float64)[:, None]
    sums = np.zeros((len(windows.counts), vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, windows.owners, vectors.astype(np.float64) * weights)
    totals = np.zeros(len(windows.counts), dtype=np.float64)
    np.add.at(totals, windows.owners, tokens.astype(np.float64))
    means: npt.NDArray[Any] = (sums / np.maximum(totals, 1.0)[:, None]).astype(np.float32)
    return means


def max_per_id(
    ids: list[npt.NDArray[Any]], weights: list[npt.NDArray[Any]], windows: Windows
) -> tuple[list[npt.NDArray[Any]], list[npt.NDArray[Any]]]:
    """Each input's sparse weights: the largest weight of each id over its windows, ids ascending."""
    out_ids, out_weights, start = [], [], 0
    for count in windows.counts:
        all_ids = np.concatenate(ids[start : start + count])
        all_weights = np.concatenate(weights[start : start + count])
        unique, inverse = np.unique(all_ids, return_inverse=True)
        best = np.full(len(unique), -np.inf, dtype=np.float32)
        np.maximum.at(best, inverse, all_weights.astype(np.float32))
        out_ids.append(unique)
        out_weights.append(best)
        start += count
    return out_ids, out_weights


def concatenated(rows: list[npt.NDArray[Any]], windows: Windows) -> list[npt.NDArray[Any]]:
    """Each input's per-token vectors, its windows' in order."""
    out, start = [], 0
    for count in windows.counts:
        out.append(np.concatenate(rows[start : start + count]) if count > 1 else rows[start])
        start += count
    return out


def best_of(values: npt.NDArray[Any], windows: Windows) -> npt.NDArray[np.float32]:
    """Each input's largest value over its windows (Cohere's score of a chunked document)."""
    best = np.full(len(windows.counts), -np.inf, dtype=np.float32)
    np.maximum.at(best, windows.owners, values)
    return best


def summed(tokens: npt.NDArray[Any], windows: Windows) -> npt.NDArray[Any]:
    """Each input's tokens read over all its windows."""
    totals = np.zeros(len(windows.counts), dtype=np.int64)
    np.add.at(totals, windows.owners, tokens.astype(np.int64))
    return totals
