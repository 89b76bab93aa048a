"""Tokenize stage: UTF-8 text (and optional second segment) -> right-padded token ids.

All texts of all requests in one `execute` go through one `encode_batch` call (the fast
tokenizer parallelises it); each request then gets tensors padded only to its own longest row,
or, when `length_buckets` is set, to the smallest bucket that holds it: native encoders
(TensorRT, onnxruntime backend) batch only requests of equal shape, and buckets make shapes
repeat. Config parameters: `tokenizer_file`, `max_length`, `truncation_side` (right|left),
`pair_truncation` (`contract.PAIR_TRUNCATIONS`: how a pair too long for `max_length` is cut), `pad_id`,
optional `length_buckets` (ascending, comma-separated, the last one `max_length`) and `strip_texts`
(`contract.STRIP_TEXTS`: each text read as the model's reference library reads it).

An LLM reranker (Qwen3-Reranker) reads each (query, document) pair as one text: `pair_format` filled
in (its instruction the model's `pair_instruction`) and cut to what `pair_prefix` and `pair_suffix`
leave of `max_length`, between those two, each tokenized on its own as the model card does. A lone
`text` is taken as that middle part already filled in: how the gateway sends a request's own
instruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy.typing as npt
import prensa_stage as contract
from tokenizers import Encoding, Tokenizer

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by unit tests of the functions above the model
    pb_utils = None


def load_tokenizer(path: Path, max_length: int | None, side: str = "right") -> Tokenizer:
    """The tokenizer file without padding, truncating single texts at `max_length` (None: never)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length, direction=side)
    return tokenizer


Item = str | tuple[str, str]


def prompt_length(tokenizer: Tokenizer, prompt: str) -> int:
    """The tokens a prompt adds in front of a text, as sentence-transformers counts them for a
    pooling that leaves the prompt out: the prompt tokenized alone, less a trailing special token
    (the `[SEP]` or end-of-text a post-processor appends); a leading one (`[CLS]`, `<bos>`) counts."""
    encoding = tokenizer.encode(prompt)
    count = len(encoding.ids)
    return count - 1 if count and encoding.special_tokens_mask[-1] else count


class Tokens(NamedTuple):
    """A tokenized row, as `Encoding` gives it to `pad_encodings`."""

    ids: list[int]
    type_ids: list[int]


@dataclass(frozen=True)
class PairTemplate:
    """An LLM reranker's prompt around each pair (see the module docstring)."""

    prefix: str
    suffix: str
    format: str
    instruction: str

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> PairTemplate | None:
        if "pair_format" not in params:
            return None
        return cls(
            params["pair_prefix"],
            params["pair_suffix"],
            params["pair_format"],
            params["pair_instruction"],
        )

    def text(self, query: str, document: str, instruction: str | None = None) -> str:
        """The middle part for one pair: the format filled in."""
        return self.format.format(
            instruction=self.instruction if instruction is None else instruction,
            query=query,
            document=document,
        )

    def edges(self, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
        """The prefix's and the suffix's token ids, each tokenized alone."""
        return (
            tokenizer.encode(self.prefix, add_special_tokens=False).ids,
            tokenizer.encode(self.suffix, add_special_tokens=False).ids,
        )


def cut_pair(
    tokenizer: Tokenizer,
    first: Encoding,
    second: Encoding,
    max_length: int,
    rule: str,
    side: str,
) -> Encoding:
    """A pair's content encodings cut to `max_length` by `rule` (`contract.pair_lengths`), with the
    special tokens added: how the stage and the gateway's token path both cut a pair. `tokenizer`
    must not truncate (its post-processing would cut again)."""
    room = max_length - tokenizer.num_special_tokens_to_add(True)
    kept = contract.pair_lengths(len(first), len(second), room, rule, max_length)
    for encoding, keep in zip((first, second), kept):
        if keep < len(encoding):
            encoding.truncate(keep, direction=side)
    processed: Encoding = tokenizer.post_process(first, second)
    return processed


class TextEncoder:
    """Tokenizes many requests in as few `encode_batch` calls as possible.

    Single texts are cut at `max_length`, pairs by `pair_rule` (`contract.PAIR_TRUNCATIONS`); with
    `strip`, every text is stripped first (`contract.STRIP_TEXTS`). A batch that fails is retried
    request by request, so only the offending request gets the error.
    """

    def __init__(
        self,
        path: Path,
        max_length: int,
        side: str = "right",
        pair_rule: str = contract.LONGEST_FIRST,
        template: PairTemplate | None = None,
        strip: bool = False,
    ) -> None:
        if pair_rule not in contract.PAIR_TRUNCATIONS:
            raise ValueError(
                f"pair_truncation {pair_rule!r} is not one of {', '.join(contract.PAIR_TRUNCATIONS)}"
            )
        self.template = template
        self.whole = load_tokenizer(path, None)
        if template is not None:
            self.prefix, self.suffix = template.edges(self.whole)
            max_length -= len(self.prefix) + len(self.suffix)  # what the middle part may take
        self.single = load_tokenizer(path, max_length, side)
        self.max_length, self.side, self.pair_rule, self.strip = max_length, side, pair_rule, strip

    @classmethod
    def from_parameters(cls, params: dict[str, str], version_dir: Path) -> TextEncoder:
        """The encoder a model config's parameters describe (see the module docstring)."""
        return cls(
            version_dir / params["tokenizer_file"],
            int(params["max_length"]),
            params.get("truncation_side", "right"),
            params.get("pair_truncation", contract.LONGEST_FIRST),
            PairTemplate.from_parameters(params),
            contract.strips_texts(params),
        )

    def _read(self, item: Item) -> Item:
        """One input's texts as the model's reference library hands them to its tokenizer."""
        if isinstance(item, tuple):
            return contract.read_text(item[0], self.strip), contract.read_text(item[1], self.strip)
        text: str = contract.read_text(item, self.strip)
        return text

    def _encode(self, requests: Sequence[Sequence[Item]]) -> list[list[Encoding | Tokens]]:
        if self.strip:
            requests = [[self._read(item) for item in items] for items in requests]
        if self.template is not None:
            return self._encode_templated(requests, self.template)
        flat = [item for items in requests for item in items]
        encoded: list[Encoding | Tokens | None] = [None] * len(flat)
        singles = [i for i, item in enumerate(flat) if isinstance(item, str)]
        if singles:
            for i, encoding in zip(singles, self.single.encode_batch([flat[i] for i in singles])):
                encoded[i] = encoding
        pairs = [i for i, item in enumerate(flat) if isinstance(item, tuple)]
        if pairs:
            for i, encoding in zip(pairs, self._encode_pairs([flat[i] for i in pairs])):
                encoded[i] = encoding
        return _split(encoded, requests)

    def _encode_pairs(self, pairs: list[Item]) -> list[Encoding]:
        """Each (first, second) pair's texts tokenized apart, then cut together by the pair rule."""
        firsts = self.whole.encode_batch([pair[0] for pair in pairs], add_special_tokens=False)
        seconds = self.whole.encode_batch([pair[1] for pair in pairs], add_special_tokens=False)
        return [
            cut_pair(self.whole, first, second, self.max_length, self.pair_rule, self.side)
            for first, second in zip(firsts, seconds)
        ]

    def _encode_templated(
        self, requests: Sequence[Sequence[Item]], template: PairTemplate
    ) -> list[list[Encoding | Tokens]]:
        """Each pair filled into the template (a lone text is already), cut, between prefix and suffix."""
        flat = [
            template.text(*item) if isinstance(item, tuple) else item
            for items in requests
            for item in items
        ]
        encoded: list[Encoding | Tokens | None] = []
        for encoding in self.single.encode_batch(flat):
            ids = [*self.prefix, *encoding.ids, *self.suffix]
            encoded.append(Tokens(ids, [0] * len(ids)))
        return _split(encoded, requests)

    def encode_requests(
        self, requests: Sequence[Sequence[Item]]
    ) -> Sequence[list[Encoding | Tokens] | Exception]:
        try:
            return self._encode(requests)
        except Exception:  # noqa: BLE001 - find which request failed; the others still succeed
            results: list[list[Encoding | Tokens] | Exception] = []
            for items in requests:
                try:
                    results.append(self._encode([items])[0])
                except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
                    results.append(exc)
            return results


def _split(
    encoded: list[Encoding | Tokens | None], requests: Sequence[Sequence[Item]]
) -> list[list[Encoding | Tokens]]:
    """The flat encodings back into one list per request (every slot is filled)."""
    split, start = [], 0
    for items in requests:
        split.append([e for e in encoded[start : start + len(items)] if e is not None])
        start += len(items)
    return split


def decode_texts(column: npt.NDArray[Any]) -> list[str]:
    """BYTES tensor -> str; raises UnicodeDecodeError for invalid UTF-8."""
    return [
        item.decode("utf-8") if isinstance(item, bytes) else str(item)
        for item in column.reshape(-1)
    ]


def bucket_width(longest: int, buckets: list[int]) -> int:
    """The smallest bucket holding `longest` tokens; `longest` itself without buckets."""
    return next((b for b in buckets if b >= longest), longest)


def pad_encodings(
    encodings: list[Encoding | Tokens], pad_id: int, buckets: list[int] | None = None
) -> dict[str, npt.NDArray[Any]]:
    """Right-pad one request's encodings to its longest row, or to that row's length bucket."""
    ids = [e.ids for e in encodings]
    width = bucket_width(max((len(row) for row in ids), default=0), buckets or [])
    padded: dict[str, npt.NDArray[Any]] = contract.pad_token_rows(
        ids, [e.type_ids for e in encodings], pad_id, width
    )
    return padded


def read_items(request: Any) -> Sequence[Item]:
    """A request's texts, or (text, text_pair) tuples; ValueError when it has no text or the counts differ."""
    text_tensor = pb_utils.get_input_tensor_by_name(request, contract.TEXT)
    if text_tensor is None:
        raise ValueError(f"the request has no {contract.TEXT} input")
    texts = decode_texts(text_tensor.as_numpy())
    pair_tensor = pb_utils.get_input_tensor_by_name(request, contract.TEXT_PAIR)
    if pair_tensor is None:
        return texts
    pairs = decode_texts(pair_tensor.as_numpy())
    if len(pairs) != len(texts):
        raise ValueError(
            f"{contract.TEXT_PAIR} has {len(pairs)} rows, {contract.TEXT} has {len(texts)}"
        )
    return list(zip(texts, pairs))


def tokenize_requests(
    encoder: TextEncoder, requests: Sequence[Any], pad_id: int, buckets: list[int] | None = None
) -> list[dict[str, npt.NDArray[Any]] | Exception]:
    """Padded token tensors per request, every text in one `encode_batch`; a request that cannot be
    read or tokenized gets its own exception, the others their tensors."""
    readable: list[Sequence[Item]] = []
    outcome: list[Exception | None] = []
    for request in requests:
        try:
            readable.append(read_items(request))
            outcome.append(None)
        except (UnicodeDecodeError, ValueError) as exc:
            outcome.append(exc)
    encoded = iter(encoder.encode_requests(readable))
    results: list[dict[str, npt.NDArray[Any]] | Exception] = []
    for failed in outcome:
        result = failed or next(encoded)
        results.append(
            result if isinstance(result, Exception) else pad_encodings(result, pad_id, buckets)
        )
    return results


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = contract.parameters(args["model_config"])
        self.encoder = TextEncoder.from_parameters(
            params, Path(args["model_repository"]) / args["model_version"]
        )
        self.pad_id = int(params["pad_id"])
        self.buckets = contract.int_list(params.get("length_buckets", ""))

    def execute(self, requests: list[Any]) -> list[Any]:
        return [
            pb_utils.InferenceResponse(error=pb_utils.TritonError(f"invalid input: {result}"))
            if isinstance(result, Exception)
            else pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in result.items()])
            for result in tokenize_requests(self.encoder, requests, self.pad_id, self.buckets)
        ]
