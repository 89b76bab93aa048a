"""Gateway-side tokenization: only when Triton's tokenize stage cannot do the job alone.

The ensemble's tokenize stage always truncates on the right at the model's max length, a pair by
the model's pair rule (`contract.PAIR_TRUNCATIONS`). The gateway tokenizes itself (with the stage's
own tokenizer file, and the stage's own code for pairs) when a request needs more: `truncate: false`
(count, refuse too long inputs), `truncation_direction: left`, token-id inputs and `/embed_all`.
Truncation keeps the special tokens: content is cut, then the post-processor adds them back,
exactly as `tokenizers` does when truncation is enabled.

A text longer than the model's window in characters (`window_chars`) is first cut to the whole
words that hold one token more than the window (`bound_texts`), once per distinct text and from a
tokenization of a bounded piece of it, before anything tokenizes it per input or per pair: a long
rerank query then costs one bounded tokenization instead of one whole tokenization per passage,
here and in Triton's tokenize stage. What needs every token of a long text (the count a
`truncate: false` refusal names, `/tokenize`) tokenizes it a piece at a time (`_content_pieces`).
Both rest on pre-tokenizers splitting on local context: the tokens of words the tokenizer has
seen whole, away from where a piece starts, are those of the whole text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import chain, islice
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
from tokenizers import Encoding, Tokenizer

from prensa.gateway.errors import ErrorKind, GatewayError, validation
from prensa.stages import contract, load_stage

Item = str | list[int]  # one input: a text or token ids used as they are
TOKENIZE_STAGE = load_stage("tokenize")  # pairs are cut by the stage's own code


class PromptedText(str):
    """A text with a prompt put before it, for a model whose pooling leaves the prompt's tokens out
    (`ServedModel.include_prompt`): the text itself is `prompt + text`, and `prompt` says how much
    of it the gateway marks (`contract.mark_prompts`)."""

    prompt: str

    def __new__(cls, prompt: str, text: str) -> PromptedText:
        made = super().__new__(cls, prompt + text)
        made.prompt = prompt
        return made

    def stripped(self) -> PromptedText:
        """The whole text stripped, as sentence-transformers 5.3 strips `prompt + text`; the prompt is
        kept as given (its length is counted from it stripped alone, as that library counts it)."""
        made = str.__new__(PromptedText, str.strip(self))
        made.prompt = self.prompt
        return made


def read_item(item: Item, strip: bool) -> Item:
    """One input as the model's reference library hands it to the tokenizer (`contract.STRIP_TEXTS`);
    token ids as they are."""
    if not strip or isinstance(item, list):
        return item
    return item.stripped() if isinstance(item, PromptedText) else contract.read_text(item, strip)


def as_items(inputs: str | list[int] | list[str | list[int]]) -> list[Item]:
    """A request's `input(s)` field as a batch: a text or one token-id list is a batch of one."""
    if isinstance(inputs, str):
        return [inputs]
    if inputs and all(isinstance(item, int) for item in inputs):
        return [list(cast("list[int]", inputs))]
    return list(cast("list[Item]", inputs))


@dataclass(frozen=True)
class Truncation:
    enabled: bool
    direction: str  # "right" or "left"
    # a request's own token cap under the model's max length, special tokens included (vLLM's
    # `truncate_prompt_tokens`); None: the model's
    window: int | None = None

    def max_length(self, model_max_length: int) -> int:
        """The most tokens an input keeps under this truncation."""
        return model_max_length if self.window is None else min(self.window, model_max_length)


@dataclass
class TokenRows:
    ids: list[list[int]]
    type_ids: list[list[int]]
    cut: bool  # some row was truncated
    # per row, leading tokens the pooling leaves out (a prompt's)
    prompt_tokens: list[int] | None = None
    # per row, its attention mask where it is not all 1 (a late-interaction query's expansion)
    masks: list[list[int]] | None = None

    def select(self, rows: slice) -> TokenRows:
        prompts = self.prompt_tokens[rows] if self.prompt_tokens else None
        masks = self.masks[rows] if self.masks else None
        return TokenRows(self.ids[rows], self.type_ids[rows], self.cut, prompts, masks)

    def framed(self, prefix: Sequence[int], suffix: Sequence[int]) -> TokenRows:
        """Each row between an LLM reranker's prompt prefix and suffix, as the tokenize stage frames it."""
        ids = [[*prefix, *row, *suffix] for row in self.ids]
        return TokenRows(ids, [[0] * len(row) for row in ids], self.cut)

    @property
    def lengths(self) -> list[int]:
        return [len(row) for row in self.ids]

    def padded(self, pad_id: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
        """Right-padded `input_ids`, `attention_mask`, `token_type_ids`, as the tokenize stage sends them."""
        arrays = contract.pad_token_rows(self.ids, self.type_ids, pad_id)
        mask = contract.mark_prompts(arrays[contract.ATTENTION_MASK], self.prompt_tokens or ())
        for row, values in enumerate(self.masks or ()):
            mask[row, : len(values)] = values
        return arrays[contract.INPUT_IDS], mask, arrays[contract.TOKEN_TYPE_IDS]


@dataclass(frozen=True)
class QueryFraming:
    """A late-interaction model's queries as PyLate frames them: its query tokenizer (the marker
    token, cut and with expansion padded to the query length with the mask token), and whether
    other tokens attend to the expansion tokens."""

    tokenizer: Tokenizer
    attend_to_expansion: bool


def query_rows(framing: QueryFraming, texts: list[str]) -> TokenRows:
    """`texts` framed as queries; their expansion tokens marked `contract.UNATTENDED_TOKEN` unless
    the model attends to them."""
    encodings = framing.tokenizer.encode_batch(texts)
    expansion = 1 if framing.attend_to_expansion else contract.UNATTENDED_TOKEN
    return TokenRows(
        [e.ids for e in encodings],
        [e.type_ids for e in encodings],
        any(e.overflowing for e in encodings),
        masks=[[1 if m else expansion for m in e.attention_mask] for e in encodings],
    )


INT64_LIMIT = 2**63


def token_id_limit(tokenizer: Tokenizer | None) -> int:
    """One past the largest valid id: the vocabulary size, or int64's limit without a tokenizer. It
    walks the whole vocabulary: compute it once per model, not per request."""
    return tokenizer.get_vocab_size(True) if tokenizer is not None else INT64_LIMIT


def longest_token(tokenizer: Tokenizer | None) -> int:
    """Characters of the vocabulary's longest token (byte-level tokens counted as written): no text
    of N tokens is longer than N times this. Walks the vocabulary: once per model."""
    return (
        max(map(len, tokenizer.get_vocab(True)), default=1)
        if tokenizer is not None
        else CHARS_PER_TOKEN
    )


def check_token_ids(ids: list[int], limit: int) -> None:
    """Ids in [0, limit): a negative id would index the embedding matrix from its end and answer
    with a wrong vector."""
    if not all(0 <= t < limit for t in ids):
        raise validation(f"token ids must lie in [0, {limit})")


def may_fill(tokenizer: Tokenizer, text: str, max_length: int) -> bool:
    """Whether `text` may hold `max_length` tokens: no tokenizer gives a text more tokens than its
    UTF-8 bytes, besides the special tokens it adds."""
    specials: int = tokenizer.num_special_tokens_to_add(False)
    return len(text.encode("utf-8")) + specials >= max_length


def filling_tokens(tokenizer: Tokenizer, texts: Iterable[str], max_length: int) -> int | None:
    """The tokens of the first of `texts` that holds at least `max_length` (special tokens
    included), or None when none does: an LLM reranker's prompt up to the document, which would
    leave no room for it."""
    for text in set(texts):
        if may_fill(tokenizer, text, max_length):
            count = len(tokenizer.encode(text))
            if count >= max_length:
                return count
    return None


def too_long(max_length: int, given: int) -> Exception:
    return validation(f"`inputs` must have less than {max_length} tokens. Given: {given}")


@dataclass(frozen=True)
class JoinedChunks:
    """Chunks of one document as one sequence (Jina's late chunking): its token ids, special
    tokens included, and where each chunk's own tokens lie in it."""

    ids: list[int]
    spans: list[range]


def joined_chunks(tokenizer: Tokenizer, texts: list[str], max_length: int) -> JoinedChunks:
    """`texts` tokenized each on its own, in order, then framed once by the model's special tokens,
    as the whole document would be read; past `max_length` tokens they are refused (one pass reads
    them, so nothing may be cut)."""
    parts = tokenizer.encode_batch(texts, add_special_tokens=False)
    if empty := [i for i, part in enumerate(parts) if not part.ids]:
        raise validation(f"late chunking: inputs {empty} have no tokens to pool")
    joined = tokenizer.post_process(Encoding.merge(parts, growing_offsets=True))
    if len(joined.ids) > max_length:
        raise validation(
            f"late chunking reads the inputs in one pass of at most {max_length} tokens; these "
            f"take {len(joined.ids)}: send fewer or shorter chunks"
        )
    start = joined.special_tokens_mask.index(0) if 0 in joined.special_tokens_mask else 0
    spans = []
    for part in parts:
        spans.append(range(start, start + len(part.ids)))
        start += len(part.ids)
    return JoinedChunks(joined.ids, spans)


CHARS_PER_TOKEN = 8  # a generous bound on the characters of one token of natural text


def window_chars(tokens: int) -> int:
    """Texts up to this many characters for a window of `tokens` are tokenized as they are; longer
    ones are measured in pieces of this size (doubled while a piece holds too few whole words)."""
    return max(tokens, 1) * CHARS_PER_TOKEN


def _measuring(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, or a copy without its post-processor when that trims offsets (ByteLevel, RoBERTa):
    the cuts need each token's offsets as the pre-tokenizer made them. Content ids are the same."""
    processor = tokenizer.post_processor
    if processor is None or b'"trim_offsets":true' not in processor.__getstate__():
        return tokenizer
    return _untrimmed(tokenizer)


@lru_cache(maxsize=8)  # a few tokenizers, and the ones a reload of a changed file replaced
def _untrimmed(tokenizer: Tokenizer) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.post_processor = None
    copy.no_truncation()
    copy.no_padding()
    return copy


def _content(tokenizer: Tokenizer, text: str) -> Encoding:
    return _measuring(tokenizer).encode(text, add_special_tokens=False)


def _word_start(words: list[int | None], token: int) -> int:
    """The index of the first token of the word that holds `token`."""
    while token > 0 and words[token - 1] == words[token]:
        token -= 1
    return token


def _resume(text: str, offsets: list[tuple[int, int]], words: list[int | None], token: int) -> int:
    """Where tokenizing `text` may start so that `token`, the first of its word, and the tokens after
    it come out as in the whole text: at a space that starts or precedes that word (tokenizers split
    there whatever came before, and add no prefix space to a text that starts with one), else two
    words earlier, whose changed start (a prefix space, a contraction cut off) does not reach it.
    0 when there is no such place."""
    start = offsets[token][0]
    if text[start : start + 1] == " ":
        return start
    if text[start - 1 : start] == " ":
        return start - 1
    for _ in range(2):
        if token == 0:
            return 0
        token = _word_start(words, token - 1)
    return offsets[token][0]


def _word_cut(piece: str, encoding: Encoding, keep: int, direction: str) -> int | None:
    """Where to cut the tokenized piece so that it keeps the whole words that hold its first `keep`
    tokens (its last ones on the left): at the start of the next word, so that what lies between two
    words (spaces, a combining mark the normalizer folded into a token) stays; on the left where
    tokenizing may start (`_resume`). None when the piece has fewer tokens or that word may run on
    beyond it (the piece's last word; on the left, when no word before it gives the context)."""
    words = encoding.word_ids
    if len(words) < keep:
        return None
    if direction == "left":
        at = _resume(piece, encoding.offsets, words, _word_start(words, len(words) - keep))
        return at or None
    last = keep - 1
    while last + 1 < len(words) and words[last + 1] == words[last]:
        last += 1
    return encoding.offsets[last + 1][0] if last + 1 < len(words) else None


def _same_tokens(
    tokenizer: Tokenizer, text: str, reference: Encoding, keep: int, direction: str
) -> bool:
    """Whether `text` gives the `keep` tokens of `reference` the model reads (all of them when fewer)."""
    ids: list[int] = _content(tokenizer, text).ids
    expected: list[int] = reference.ids
    return ids[-keep:] == expected[-keep:] if direction == "left" else ids[:keep] == expected[:keep]


def keep_tokens(tokenizer: Tokenizer, text: str, keep: int, direction: str) -> str:
    """`text`, or the shortest run of its whole words from its start (its end for `left`) holding at
    least `keep` tokens: what a window of fewer than `keep` tokens reads is the same for both.
    Measured on a piece of `window_chars(keep)` characters; a piece whose whole words hold fewer
    tokens (very long words, long runs of spaces) is doubled, up to the whole text. A whole text that
    still has no such cut (one long word) is cut to one window's piece when that piece gives the
    same tokens. Texts of at most one window are returned as they are, unmeasured."""
    window = window_chars(keep)
    if len(text) <= window:
        return text
    size = window
    while True:
        whole = size >= len(text)
        piece = text if whole else text[-size:] if direction == "left" else text[:size]
        encoding = _content(tokenizer, piece)
        at = _word_cut(piece, encoding, keep, direction)
        if at is not None:
            piece = piece[at:] if direction == "left" else piece[:at]
        if at is not None or whole:
            break
        size *= 2
    if len(piece) > window:
        shorter = piece[-window:] if direction == "left" else piece[:window]
        if _same_tokens(tokenizer, shorter, encoding, keep, direction):
            return shorter
    return piece


def bound_texts(
    tokenizer: Tokenizer,
    items: list[Item],
    pairs: list[str] | None,
    max_length: int,
    direction: str,
) -> tuple[list[Item], list[str] | None]:
    """`items` and `pairs` with every text longer than the window cut to what a window of
    `max_length` tokens reads (`keep_tokens`), once per distinct text; one token more than the
    window holds is kept, so a cut text is truncated where the whole one is."""
    keep, limit = max_length + 1, window_chars(max_length + 1)
    cut_once = cache(lambda text: keep_tokens(tokenizer, text, keep, direction))

    def cut(item: Item) -> Item:
        return cut_once(item) if isinstance(item, str) and len(item) > limit else item

    return [cut(item) for item in items], [
        cast(str, cut(pair)) for pair in pairs
    ] if pairs is not None else None


def has_long_texts(items: Sequence[Item], pairs: Sequence[str] | None, max_length: int) -> bool:
    """Whether `bound_texts` would measure anything: short texts cost a length check, no thread."""
    limit = window_chars(max_length + 1)
    return any(isinstance(item, str) and len(item) > limit for item in chain(items, pairs or ()))


def _content_pieces(
    tokenizer: Tokenizer, text: str, window: int
) -> Iterator[tuple[int, Encoding, range]]:
    """The content tokens of `text` a piece of about `window` characters at a time, with the memory
    of tokenizing one piece: (where the piece starts, its encoding, which of its tokens come next in
    the whole text's). A piece gives the tokens before its last word, which may run on; the next one
    starts where the tokens from that word on come out as in the whole text (`_resume`). A piece with
    no whole word past the given tokens, or no place to go on from, is doubled."""
    origin, given, size = 0, 0, window  # the tokens starting before `given` are given
    while True:
        whole = len(text) - origin <= size
        piece = text[origin:] if whole else text[origin : origin + size]
        encoding = _content(tokenizer, piece)
        offsets, words = encoding.offsets, encoding.word_ids
        first = next(
            (i for i, (start, _) in enumerate(offsets) if origin + start >= given), len(offsets)
        )
        if whole:
            yield origin, encoding, range(first, len(offsets))
            return
        last = _word_start(words, len(words) - 1)
        resume = _resume(piece, offsets, words, last) if last > first else 0
        if resume <= 0:
            size *= 2
            continue
        yield origin, encoding, range(first, last)
        given, origin, size = origin + offsets[last][0], origin + resume, window


def count_tokens(tokenizer: Tokenizer, text: str, window: int) -> int:
    """The content tokens of `text`, counted in pieces (`_content_pieces`)."""
    return sum(len(tokens) for _, _, tokens in _content_pieces(tokenizer, text, window))


def _refuse_too_long(
    tokenizer: Tokenizer, firsts: list[str], seconds: list[str] | None, max_length: int
) -> None:
    """Refuse the first input (or pair) with more tokens than `max_length`, naming its count, when
    some text is longer than the window: each distinct text is counted once, in pieces."""
    window = window_chars(max_length)
    if not any(len(text) > window for text in chain(firsts, seconds or ())):
        return
    count = cache(lambda text: count_tokens(tokenizer, text, window))
    specials = tokenizer.num_special_tokens_to_add(seconds is not None)
    for row, first in enumerate(firsts):
        content = count(first) + (count(seconds[row]) if seconds is not None else 0)
        if content > max_length - specials:
            raise too_long(max_length, content + specials)


def tokenize_items(
    tokenizer: Tokenizer | None,
    items: list[Item],
    pairs: list[str] | None,
    max_length: int,
    truncation: Truncation,
    id_limit: int,
    pair_rule: str = contract.LONGEST_FIRST,
) -> TokenRows:
    """Token ids per input, special tokens added to texts (not to token-id inputs, which must lie in
    [0, `id_limit`)), truncated or refused; pairs cut by the model's `pair_rule` with the tokenize
    stage's own code. Texts that may be truncated come cut by `bound_texts`."""
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
    if not truncation.enabled:
        _refuse_too_long(
            tokenizer,
            [text for _, text in texts],
            [pairs[i] for i, _ in texts] if pairs else None,
            max_length,
        )
    firsts = tokenizer.encode_batch([text for _, text in texts], add_special_tokens=False)
    seconds = (
        tokenizer.encode_batch([pairs[i] for i, _ in texts], add_special_tokens=False)
        if pairs
        else None
    )
    specials = tokenizer.num_special_tokens_to_add(pairs is not None)
    room = max_length - specials
    for row, (i, _) in enumerate(texts):
        first, second = firsts[row], seconds[row] if seconds else None
        content = len(first) + (len(second) if second else 0)
        if content > room and not truncation.enabled:
            raise too_long(max_length, content + specials)
        if second is not None:
            encoding = TOKENIZE_STAGE.cut_pair(
                tokenizer, first, second, max_length, pair_rule, truncation.direction
            )
        else:
            first.truncate(min(len(first), room), direction=truncation.direction)
            encoding = tokenizer.post_process(first)
        # a rule may cut a pair that fits (CAPPED_QUERY's long query)
        cut = cut or len(encoding) < content + specials
        ids[i], type_ids[i] = encoding.ids, encoding.type_ids
    return TokenRows(ids, type_ids, cut)


# characters: `/tokenize` tokenizes a longer text in pieces of about this size
TOKENIZE_WINDOW = 65_536


def _specials(tokenizer: Tokenizer) -> tuple[list[tuple[int, str, tuple[int, int], bool]], ...]:
    """The special tokens the post-processor puts before and after a text's content."""
    encoding = tokenizer.encode("a", add_special_tokens=True)
    rows = list(
        zip(
            encoding.ids, encoding.tokens, encoding.offsets, map(bool, encoding.special_tokens_mask)
        )
    )
    content = [i for i, (*_, special) in enumerate(rows) if not special]
    return rows[: content[0]], rows[content[-1] + 1 :]


def _encoded(
    tokenizer: Tokenizer, text: str, add_special_tokens: bool
) -> Iterator[tuple[int, str, tuple[int, int], bool]]:
    """(id, token, character offsets, special) of each token of `text`'s encoding. A text longer than
    `TOKENIZE_WINDOW` is tokenized in pieces (`_content_pieces`): a whole 2 MB text takes the
    tokenizer some 300 MB. Not for tokenizers that trim offsets, whose pieces would not say them."""
    if len(text) <= TOKENIZE_WINDOW or _measuring(tokenizer) is not tokenizer:
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        yield from zip(
            encoding.ids, encoding.tokens, encoding.offsets, map(bool, encoding.special_tokens_mask)
        )
        return
    before, after = _specials(tokenizer) if add_special_tokens else ([], [])
    yield from before
    for origin, encoding, tokens in _content_pieces(tokenizer, text, TOKENIZE_WINDOW):
        ids, names, offsets, specials = (
            encoding.ids,
            encoding.tokens,
            encoding.offsets,
            encoding.special_tokens_mask,
        )
        for i in tokens:
            yield (
                ids[i],
                names[i],
                (origin + offsets[i][0], origin + offsets[i][1]),
                bool(specials[i]),
            )
    yield from after


def simple_tokens(
    tokenizer: Tokenizer, text: str, add_special_tokens: bool, strip: bool = False
) -> Iterator[dict[str, object]]:
    """TEI's `/tokenize` items, one at a time: the tokens of `text` as the model reads it (stripped
    where it strips, `contract.STRIP_TEXTS`), with byte offsets into the UTF-8 input; special tokens
    carry no offsets."""
    data = text.encode("utf-8")
    read = contract.read_text(text, strip)
    shift = len(text) - len(text.lstrip()) if strip else 0  # characters stripped before it
    byte_at = (
        np.cumsum([0, *(len(c.encode("utf-8")) for c in text)]) if not text.isascii() else None
    )
    for token_id, token, (start, stop), special in _encoded(tokenizer, read, add_special_tokens):
        if special:
            yield {"id": token_id, "text": token, "special": True, "start": None, "stop": None}
            continue
        start, stop = start + shift, stop + shift
        if byte_at is not None:
            start, stop = int(byte_at[start]), int(byte_at[stop])
        yield {
            "id": token_id,
            "text": data[start:stop].decode("utf-8", errors="replace"),
            "special": False,
            "start": start,
            "stop": stop,
        }


TOKENS_PER_SLICE = 4096


def too_many_tokens(limit: int, held: str) -> GatewayError:
    return GatewayError(
        ErrorKind.PAYLOAD_TOO_LARGE,
        f"/tokenize and /decode take at most {limit} tokens a request (--max-tokenize-tokens; default "
        f"--max-client-batch-size x the model's max length); this one holds {held}",
    )


def tokens_json(
    tokenizer: Tokenizer,
    texts: list[str],
    add_special_tokens: bool,
    limit: int | None = None,
    strip: bool = False,
) -> orjson.Fragment:
    """`/tokenize`'s answer as JSON, serialized a slice of tokens at a time: a dict for every token
    of a 2 MB body at once would take several times the memory of the JSON itself. Past `limit`
    tokens in all it stops with 413, having tokenized no more than that."""
    body = bytearray(b"[")
    count = 0
    for n, text in enumerate(texts):
        body += b",[" if n else b"["
        tokens = simple_tokens(tokenizer, text, add_special_tokens, strip)
        while chunk := list(islice(tokens, TOKENS_PER_SLICE)):
            count += len(chunk)
            if limit is not None and count > limit:
                raise too_many_tokens(limit, f"more ({count} by text {n})")
            if body[-1:] != b"[":
                body += b","
            # the slice's items, without the brackets of its own array
            body += orjson.dumps(chunk)[1:-1]
        body += b"]"
    body += b"]"
    return orjson.Fragment(bytes(body))
