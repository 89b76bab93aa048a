"""The torch modules traced to ONNX, one per task: each returns exactly the encoder outputs the
pool stage expects (names in `prensa/ensembles/prensa_stage.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from prensa.export.safe_load import pretrained_options, refusing_pickled_code
from prensa.manifest import GraphOutput, Task
from prensa.stages import contract


def _call(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
          token_type_ids: torch.Tensor | None) -> Any:
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    return model(**kwargs)


class HiddenStateGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return cast(torch.Tensor, _call(self.model, input_ids, attention_mask, token_type_ids).last_hidden_state)


class M3Graph(nn.Module):
    """bge-m3: hidden states plus both heads in one pass; normalisation and masking happen in pool."""

    def __init__(self, model: nn.Module, sparse_linear: nn.Linear, colbert_linear: nn.Linear) -> None:
        super().__init__()
        self.model, self.sparse_linear, self.colbert_linear = model, sparse_linear, colbert_linear

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden: torch.Tensor = _call(self.model, input_ids, attention_mask, token_type_ids).last_hidden_state
        return hidden, torch.relu(self.sparse_linear(hidden)).squeeze(-1), self.colbert_linear(hidden)


class LogitsGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return cast(torch.Tensor, _call(self.model, input_ids, attention_mask, token_type_ids).logits)


class SpladeGraph(nn.Module):
    """max over real tokens of log(1 + relu(MLM logits)): one vocabulary-sized vector per text."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        logits: torch.Tensor = _call(self.model, input_ids, attention_mask, token_type_ids).logits
        weights = torch.log1p(torch.relu(logits)) * attention_mask.unsqueeze(-1).to(logits.dtype)
        return weights.max(dim=1).values


def load_head(path: Path, hidden: int, out_features: int) -> nn.Linear:
    """bge-m3 head weights; `weights_only` so a model directory can never run pickled code."""
    head = nn.Linear(hidden, out_features)
    with refusing_pickled_code(path.name):
        head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return head.eval()


def build_graph(task: Task, model_dir: Path, attn: str = "eager") -> tuple[nn.Module, list[GraphOutput]]:
    """Load the Hugging Face model for `task` and wrap it; also say what the graph outputs."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    options = {"attn_implementation": attn, **pretrained_options(model_dir)}
    with refusing_pickled_code(f"the model weights in {model_dir.name}"):
        if task in (Task.RERANK, Task.CLASSIFY):
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, **options).eval()
            return LogitsGraph(model), [GraphOutput(contract.LOGITS, [model.config.num_labels], False)]
        if task is Task.SPLADE:
            model = AutoModelForMaskedLM.from_pretrained(model_dir, **options).eval()
            return SpladeGraph(model), [GraphOutput(contract.SPLADE_WEIGHTS, [model.config.vocab_size], False)]
        try:  # the pooler is never used; BERT-like models let us skip loading it
            model = AutoModel.from_pretrained(model_dir, add_pooling_layer=False, **options).eval()
        except TypeError:
            model = AutoModel.from_pretrained(model_dir, **options).eval()
    hidden = model.config.hidden_size
    state = GraphOutput(contract.LAST_HIDDEN_STATE, [-1, hidden], True)
    if task is Task.M3:
        sparse = load_head(model_dir / "sparse_linear.pt", hidden, 1)
        colbert = load_head(model_dir / "colbert_linear.pt", hidden, hidden)
        return M3Graph(model, sparse, colbert), [
            state,
            GraphOutput(contract.TOKEN_WEIGHTS, [-1], True),
            GraphOutput(contract.COLBERT_VECS, [-1, hidden], True),
        ]
    return HiddenStateGraph(model), [state]
