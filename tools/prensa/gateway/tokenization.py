"""Gateway-side tokenization: only when Triton's tokenize stage cannot do the job alone.

The ensemble's tokenize stage always truncates on the right at the model's max length. The
gateway tokenizes itself (with the stage's own tokenizer file) when a request needs more:
`truncate: false` (count, refuse too long inputs), `truncation_direction: left`, token-id inputs,
text pairs whose first text alone leaves no room (the stage's `only_second` strategy fails there)
and `/embed_all`. Truncation keeps the special tokens: content is cut, then the post-processor adds
them back, exactly as `tokenizers` does when truncation is enabled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from prensa.gateway.errors import validation

Item = str | list[int]  # one input: a text or token ids used as they are


def as_items(inputs: str | list[int] | list[str | list[int]]) -> list[Item]:
    """A request's `input(s)` field as a batch: a text or one token-id list is a batch of one."""
    if isinstance(inputs, str):
        return [inputs]
    if inputs and all(isinstance(item, int) for item in inputs):
        return [list(inputs)]
    return list(inputs)


@dataclass(frozen=True)
class Truncation:
    enabled: bool
    direction: str  # "right" or "left"


@dataclass
class TokenRows:
    ids: list[list[int]]
    type_ids: list[list[int]]
    cut: bool  # some row was truncated

    def select(self, rows: slice) -> TokenRows:
        return TokenRows(self.ids[rows], self.type_ids[rows], self.cut)

    @property
    def lengths(self) -> list[int]:
        return [len(row) for row in self.ids]

    def padded(self, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded `input_ids`, `attention_mask`, `token_type_ids`, as the tokenize stage sends them."""
        width = max(self.lengths, default=0)
        ids = np.full((len(self.ids), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(self.ids), width), dtype=np.int64)
        types = np.zeros((len(self.ids), width), dtype=np.int64)
        for row, (tokens, type_ids) in enumerate(zip(self.ids, self.type_ids)):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
            types[row, : len(tokens)] = type_ids
        return ids, mask, types


INT64_LIMIT = 2**63


def token_id_limit(tokenizer: Tokenizer | None) -> int:
    """One past the largest valid id: the vocabulary size, or int64's limit without a tokenizer. It
    walks the whole vocabulary (15 ms for a 30k one here): compute it once per model, not per request."""
    return tokenizer.get_vocab_size(True) if tokenizer is not None else INT64_LIMIT


def check_token_ids(ids: list[int], limit: int) -> None:
    """Ids in [0, limit): a negative id would index the embedding matrix from its end and answer
    with a wrong vector."""
    if not all(0 <= t < limit for t in ids):
        raise validation(f"token ids must lie in [0, {limit})")


INLINE_CHARS = 1024  # first texts measured on the event loop up to this many characters in all


def first_fills_pair(tokenizer: Tokenizer, firsts: Iterable[str], max_length: int) -> bool:
    """Whether a pair's first text (a rerank query) may leave no room for its second under
    `max_length`, so that the gateway must truncate: the tokenize stage's `only_second` strategy
    refuses such a pair. The distinct first texts are measured here, on the event loop, when they
    come to at most `INLINE_CHARS` characters (one short query: ~50 us); longer ones are taken to
    fill, and the pairs are then tokenized in a thread."""
    distinct = set(firsts)
    if sum(map(len, distinct)) > INLINE_CHARS:
        return True
    room = max_length - tokenizer.num_special_tokens_to_add(True)
    return any(len(tokenizer.encode(text, add_special_tokens=False)) > room for text in distinct)


def too_long(max_length: int, given: int) -> Exception:
    return validation(f"`inputs` must have less than {max_length} tokens. Given: {given}")


def _cut(encoding: Encoding, keep: int, direction: str) -> None:
    encoding.truncate(max(keep, 0), direction=direction)


def tokenize_items(tokenizer: Tokenizer | None, items: list[Item], pairs: list[str] | None, max_length: int,
                   truncation: Truncation, id_limit: int) -> TokenRows:
    """Token ids per input, special tokens added to texts (not to token-id inputs, which must lie in
    [0, `id_limit`)), truncated or refused."""
    texts = [(i, item) for i, item in enumerate(items) if isinstance(item, str)]
    ids: list[list[int]] = [[] for _ in items]
    type_ids: list[list[int]] = [[] for _ in items]
    cut = False
    for i, item in enumerate(items):
        if isinstance(item, list):
            check_token_ids(item, id_limit)
            if len(item) > max_length and not truncation.enabled:
                raise too_long(max_length, len(item))
            kept = item[-max_length:] if truncation.direction == "left" else item[:max_length]
            cut = cut or len(kept) < len(item)
            ids[i], type_ids[i] = kept, [0] * len(kept)
    if not texts:
        return TokenRows(ids, type_ids, cut)
    assert tokenizer is not None, "callers require a tokenizer for text inputs"
    firsts = tokenizer.encode_batch([text for _, text in texts], add_special_tokens=False)
    seconds = tokenizer.encode_batch([pairs[i] for i, _ in texts], add_special_tokens=False) if pairs else None
    specials = tokenizer.num_special_tokens_to_add(pairs is not None)
    room = max_length - specials
    for row, (i, _) in enumerate(texts):
        first, second = firsts[row], seconds[row] if seconds else None
        content = len(first) + (len(second) if second else 0)
        if content > room:
            if not truncation.enabled:
                raise too_long(max_length, content + specials)
            cut = True
            if second is not None:  # only_second first; the first text too if it alone is too long
                _cut(second, room - len(first), truncation.direction)
            _cut(first, room - (len(second) if second else 0), truncation.direction)
        encoding = tokenizer.post_process(first, second)
        ids[i], type_ids[i] = encoding.ids, encoding.type_ids
    return TokenRows(ids, type_ids, cut)


def simple_tokens(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> list[dict[str, object]]:
    """TEI's `/tokenize` items: byte offsets into the UTF-8 input; special tokens carry no offsets."""
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    data = text.encode("utf-8")
    byte_at = np.cumsum([0, *(len(c.encode("utf-8")) for c in text)]) if not text.isascii() else None
    tokens = []
    for token_id, token, (start, stop), special in zip(encoding.ids, encoding.tokens, encoding.offsets,
                                                       encoding.special_tokens_mask):
        if special:
            tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            continue
        if byte_at is not None:
            start, stop = int(byte_at[start]), int(byte_at[stop])
        tokens.append({"id": token_id, "text": data[start:stop].decode("utf-8", errors="replace"), "special": False,
                       "start": start, "stop": stop})
    return tokens


def _windows(tokenizer: Tokenizer, text: str, size: int, count: int) -> list[str]:
    """Up to `count` consecutive pieces of `text` of at most `size` tokens each (special tokens not
    counted), cut at token boundaries by the tokenizer's character offsets."""
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    if len(offsets) <= size:
        return [text]
    pieces = []
    for first in range(0, min(len(offsets), size * count), size):
        last = min(first + size, len(offsets)) - 1
        pieces.append(text[offsets[first][0]: offsets[last][1]])
    return pieces


def cut_texts(tokenizer: Tokenizer, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut after its first `max_tokens` tokens (Cohere's `max_tokens_per_doc`)."""
    return [_windows(tokenizer, text, max(max_tokens, 1), 1)[0] for text in texts]


def chunk_texts(tokenizer: Tokenizer, query: str, texts: list[str], max_length: int, max_chunks: int) -> list[list[str]]:
    """Each text split into up to `max_chunks` windows that fit beside `query` in a pair of
    `max_length` tokens (Cohere's `max_chunks_per_doc`); a text that fits is one window."""
    room = max_length - tokenizer.num_special_tokens_to_add(True) - len(tokenizer.encode(query, add_special_tokens=False))
    return [_windows(tokenizer, text, max(room, 1), max_chunks) for text in texts]
