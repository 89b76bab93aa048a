"""The tensor contract between prensa's Triton stages, and helpers every stage shares.

This file is copied beside each stage's `model.py` in a rendered model repository (Triton puts
the version directory on `sys.path`), so stages run in any Triton with numpy and need no
prensa install. The repository generator reads the same names from here: one place defines
what crosses each stage boundary.
"""

from __future__ import annotations

import json
from typing import Any

# Ensemble inputs: raw UTF-8 text, one element per row; `text_pair` is the second segment
# (rerank passages, classifier pairs).
TEXT = "text"
TEXT_PAIR = "text_pair"

# tokenize -> encode / pool: int64, each request right-padded to its own longest row.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"

# encode -> pool: whatever the exported graph produces (names are the graph's output names).
LAST_HIDDEN_STATE = "last_hidden_state"  # [tokens, hidden]
TOKEN_WEIGHTS = "token_weights"  # bge-m3: relu(sparse_linear(h)), [tokens]
COLBERT_VECS = "colbert_vecs"  # bge-m3: colbert_linear(h), [tokens, hidden], CLS row included
LOGITS = "logits"  # sequence classification / rerank, [labels]
SPLADE_WEIGHTS = "splade_weights"  # SPLADE: max_t log(1 + relu(mlm logits)), [vocab]

# Ensemble outputs.
DENSE = "dense"  # [dim]
SPARSE_IDS = "sparse_ids"  # int64 [k], ascending, padded with -1 to the request's longest row
SPARSE_WEIGHTS = "sparse_weights"  # fp32 [k], 0 where sparse_ids is -1
COLBERT = "colbert"  # fp32 [num_tokens - 1, dim], zero rows past each row's own count
NUM_TOKENS = "num_tokens"  # int32 [1], tokens after truncation, special tokens included
SCORES = "scores"  # fp32 [labels], sigmoid (one label) or softmax (several) of the logits

SPARSE_PAD_ID = -1


def parameters(model_config: dict[str, Any] | str) -> dict[str, str]:
    """The `parameters { key value { string_value } }` map of a model config, as plain strings."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def int_list(text: str) -> list[int]:
    """Parse a comma-separated list of ints as written by the repository generator."""
    return [int(item) for item in text.split(",") if item.strip()]
