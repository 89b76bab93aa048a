"""LLM rerankers: Qwen3-Reranker (`Qwen3ForCausalLM`), its prompt, its two-row graph and its reference.

A pair's score is the probability of "yes" against "no" as the next token after the model card's
prompt. Only those two rows of the LM head matter, so the graph computes them alone, at each row's
last real token: `logits` = logit(yes) - logit(no), whose sigmoid (the pool stage's activation for
one-label models) is the card's softmax over the two. The full vocabulary's logits are never made.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from prensa.export.source import SourceError
from prensa.layouts.llm_reranker import ARCHITECTURES
from prensa.manifest import GraphOutput
from prensa.stages import contract, load_stage

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

# Qwen3-Reranker's model card: the system prompt, the user turn's format and the assistant's opening.
QWEN3_RERANKER = dict(  # the tokenize stage's PairTemplate
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    format="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)
ANSWERS = ("no", "yes")
FIGURE = "model card"  # the export report's line


def answer_ids(tokenizer: PreTrainedTokenizerBase, name: str) -> tuple[int, int]:
    """The ids of the single tokens "no" and "yes"; a tokenizer without them cannot be this reranker."""
    vocab = tokenizer.get_vocab()
    missing = [answer for answer in ANSWERS if answer not in vocab]
    if missing:
        raise SourceError(
            f"{name}: its tokenizer has no single token {' or '.join(map(repr, missing))}; prensa serves "
            f"{', '.join(ARCHITECTURES)} as Qwen3-Reranker, which answers yes or no"
        )
    return vocab["no"], vocab["yes"]


MIN_PAIR_TOKENS = 32  # what a query and a document need at least beside the prompt


def require_room(
    tokenizer: PreTrainedTokenizerBase, template: dict[str, str], max_length: int, name: str
) -> None:
    """The prompt's prefix and suffix leave room for a pair within `max_length`, or the export stops."""
    edges = sum(
        len(tokenizer.encode(template[part], add_special_tokens=False))
        for part in ("prefix", "suffix")
    )
    if max_length - edges < MIN_PAIR_TOKENS:
        raise SourceError(
            f"{name}: its prompt takes {edges} tokens, so --max-length {max_length} leaves fewer than "
            f"{MIN_PAIR_TOKENS} for a query and a document; give at least {edges + MIN_PAIR_TOKENS}"
        )


def sample_rows(
    tokenizer: PreTrainedTokenizerBase,
    template: dict[str, str],
    queries: list[str],
    documents: list[str],
    max_length: int,
) -> dict[str, npt.NDArray[Any]]:
    """The pairs as the card builds them (prefix, the format cut to what is left, suffix, each
    tokenized alone), padded on the right as the stages pad."""
    filled = load_stage("tokenize").PairTemplate(**template)  # the stage's own formatting
    prefix = tokenizer.encode(filled.prefix, add_special_tokens=False)
    suffix = tokenizer.encode(filled.suffix, add_special_tokens=False)
    middles = tokenizer(
        [filled.text(q, d) for q, d in zip(queries, documents)],
        truncation=True,
        max_length=max_length - len(prefix) - len(suffix),
    )["input_ids"]
    rows = [[*prefix, *middle, *suffix] for middle in middles]
    padded: dict[str, npt.NDArray[Any]] = contract.pad_token_rows(
        rows, [[0] * len(row) for row in rows], int(tokenizer.pad_token_id or 0)
    )
    return padded


def load(
    model_dir: Path, tokenizer: PreTrainedTokenizerBase, name: str, attn: str = "eager"
) -> tuple[Any, int, int]:
    """The causal LM on the CPU (weights without pickled code) and its answers' ids."""
    from transformers import AutoModelForCausalLM

    from prensa.export.safe_load import pretrained_options, refusing_pickled_code

    no_id, yes_id = answer_ids(tokenizer, name)
    with refusing_pickled_code(f"the model weights in {model_dir.name}"):
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation=attn, **pretrained_options(model_dir)
        )
    model.eval()
    return model, no_id, yes_id


def reranker_graph(model: Any, no_id: int, yes_id: int) -> tuple[nn.Module, list[GraphOutput]]:
    from prensa.export.graphs import YesNoGraph

    return YesNoGraph(model, no_id, yes_id), [GraphOutput(contract.LOGITS, [1], False)]


def reference(
    model: Any, no_id: int, yes_id: int, sample: dict[str, npt.NDArray[Any]]
) -> npt.NDArray[Any]:
    """The card's score for each sample row: the full model's logits at the last real token, the
    softmax over "no" and "yes", "yes" taken; [rows, 1]."""
    import torch

    ids = torch.from_numpy(sample[contract.INPUT_IDS])
    mask = torch.from_numpy(sample[contract.ATTENTION_MASK])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    last = mask.sum(dim=1) - 1  # right-padded rows
    pair = logits[torch.arange(ids.shape[0]), last][:, [no_id, yes_id]]
    return np.asarray(torch.softmax(pair.float(), dim=-1)[:, 1:].numpy(), dtype=np.float32)
