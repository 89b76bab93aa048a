"""Tokenize stage: UTF-8 text (and optional second segment) -> right-padded token ids.

All texts of all requests in one `execute` go through one `encode_batch` call (the fast
tokenizer parallelises it); each request then gets tensors padded only to its own longest row.
Config parameters: `tokenizer_file`, `max_length`, `truncation_side` (right|left),
`pair_truncation` (only_second|longest_first), `pad_id`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import prensa_stage as contract
from tokenizers import Encoding, Tokenizer

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton, e.g. by unit tests of the functions above the model
    pb_utils = None


def load_tokenizer(path: Path, max_length: int, side: str, pair_strategy: str) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy=pair_strategy, direction=side)
    return tokenizer


def decode_texts(column: np.ndarray) -> list[str]:
    """BYTES tensor -> str; raises UnicodeDecodeError for invalid UTF-8."""
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in column.reshape(-1)]


def pad_encodings(encodings: list[Encoding], pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad one request's encodings to its longest row."""
    width = max((len(e.ids) for e in encodings), default=0)
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    types = np.zeros((len(encodings), width), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[row, :n] = encoding.ids
        mask[row, :n] = 1
        types[row, :n] = encoding.type_ids
    return {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask, contract.TOKEN_TYPE_IDS: types}


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = contract.parameters(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.tokenizer = load_tokenizer(
            version_dir / params["tokenizer_file"],
            int(params["max_length"]),
            params.get("truncation_side", "right"),
            params.get("pair_truncation", "only_second"),
        )
        self.pad_id = int(params["pad_id"])

    def _read(self, request) -> list[str | tuple[str, str]]:
        texts = decode_texts(pb_utils.get_input_tensor_by_name(request, contract.TEXT).as_numpy())
        pair_tensor = pb_utils.get_input_tensor_by_name(request, contract.TEXT_PAIR)
        if pair_tensor is None:
            return texts
        pairs = decode_texts(pair_tensor.as_numpy())
        if len(pairs) != len(texts):
            raise ValueError(f"{contract.TEXT_PAIR} has {len(pairs)} rows, {contract.TEXT} has {len(texts)}")
        return list(zip(texts, pairs))

    def execute(self, requests):
        inputs: list[list[str | tuple[str, str]] | None] = []
        errors: list[str | None] = []
        for request in requests:
            try:
                inputs.append(self._read(request))
                errors.append(None)
            except (UnicodeDecodeError, ValueError) as exc:
                inputs.append(None)
                errors.append(f"invalid input: {exc}")
        flat = [item for items in inputs if items for item in items]
        encodings = iter(self.tokenizer.encode_batch(flat)) if flat else iter(())
        responses = []
        for items, error in zip(inputs, errors):
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)))
                continue
            padded = pad_encodings([next(encodings) for _ in items], self.pad_id)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in padded.items()]))
        return responses
