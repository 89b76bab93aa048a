"""The torch modules traced to ONNX, one per task: each returns exactly the encoder outputs the
pool stage expects (names in `prensa/ensembles/prensa_stage.py`)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from prensa.export.safe_load import pretrained_options, refusing_pickled_code
from prensa.export.source import SourceError
from prensa.layouts import Layout
from prensa.manifest import GraphOutput
from prensa.stages import contract

# Decoders whose attention masks the graphs build themselves (`decoder_masks`). transformers (the
# 4.x prensa pins) builds a decoder's masks with torch.vmap, which torch's ONNX tracer cannot record ("unordered_map::at");
# handed a 4D mask (or one per layer type), the model uses it as given.
DECODER_TYPES = ("qwen3", "qwen2", "mistral", "llama", "gemma3_text")


def additive_mask(
    attention_mask: torch.Tensor,
    dtype: torch.dtype,
    causal: bool,
    window: int | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """[rows, 1, tokens, tokens]: 0 where a query token may attend, the dtype's minimum elsewhere;
    built from the mask's own shape, so rows and tokens stay dynamic in the trace."""
    positions = torch.cumsum(torch.ones_like(attention_mask[0]), 0) - 1
    query, key = positions[:, None], positions[None, :]
    allowed = attention_mask[:, None, None, :].bool()
    if causal:
        allowed = allowed & (key <= query)
    # transformers: query - key < window; bidirectional Gemma3: |query - key| < window
    if window is not None:
        allowed = allowed & (((query - key).abs() if symmetric else query - key) < window)
    return torch.where(
        allowed, torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype)
    )


def decoder_masks(
    config: Any, attention_mask: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """What a decoder takes instead of the 2D mask: causal unless the config says bidirectional
    (EmbeddingGemma), with the model's sliding window where its layers use one."""
    causal = not getattr(config, "use_bidirectional_attention", False)
    # bidirectional Gemma3's config has already halved it
    window = getattr(config, "sliding_window", None)
    # one mask; Mistral's window applies to every layer
    if config.model_type in ("llama", "mistral"):
        return additive_mask(
            attention_mask, dtype, causal, window if config.model_type == "mistral" else None
        )
    masks = {"full_attention": additive_mask(attention_mask, dtype, causal)}
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        masks["sliding_attention"] = additive_mask(
            attention_mask, dtype, causal, window, symmetric=not causal
        )
    return masks


def is_decoder(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) in DECODER_TYPES


def _call(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    own_masks: bool = True,
) -> Any:
    """The transformer on one batch; a decoder gets the masks built here (`own_masks`) or, for the
    reference the trace is checked against, transformers' own from the 2D mask."""
    if is_decoder(model):
        # transformers' default, per row
        positions = torch.cumsum(torch.ones_like(input_ids), 1) - 1
        dtype = cast(torch.dtype, model.dtype)
        masks = decoder_masks(model.config, attention_mask, dtype) if own_masks else attention_mask
        return model(
            input_ids=input_ids, attention_mask=masks, position_ids=positions, use_cache=False
        )
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    return model(**kwargs)


def takes_token_types(graph: nn.Module) -> bool:
    """Whether the traced graph reads `token_type_ids`: BERT-family encoders do; decoders and
    ModernBERT have none."""
    model = getattr(graph, "model", None)
    if model is None or is_decoder(model):
        return False
    return "token_type_ids" in inspect.signature(model.forward).parameters


class TracedGraph(nn.Module):
    """A module to trace. `own_masks` False runs a decoder with transformers' own mask code: the
    reference that shows the masks built for the trace are the model's. `marks_prompts` graphs take
    masks whose prompt tokens are `contract.PROMPT_TOKEN` (a pooling that leaves the prompt out):
    the transformer attends to every real token, the pooling reads those marked 1."""

    own_masks = True
    marks_prompts = False

    def call(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
    ) -> Any:
        if self.marks_prompts:
            attention_mask = (attention_mask > 0).to(attention_mask.dtype)
        return _call(model, input_ids, attention_mask, token_type_ids, self.own_masks)

    def pooling_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        return (
            (attention_mask == 1).to(attention_mask.dtype) if self.marks_prompts else attention_mask
        )


@contextmanager
def transformers_masks(graph: nn.Module) -> Iterator[None]:
    """Run `graph` with transformers' own decoder masks for the duration."""
    if not isinstance(graph, TracedGraph):
        yield
        return
    graph.own_masks = False
    try:
        yield
    finally:
        graph.own_masks = True


class HiddenStateGraph(TracedGraph):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return cast(
            torch.Tensor,
            self.call(self.model, input_ids, attention_mask, token_type_ids).last_hidden_state,
        )


class M3Graph(TracedGraph):
    """bge-m3: hidden states plus both heads in one pass; normalisation and masking happen in pool."""

    def __init__(
        self, model: nn.Module, sparse_linear: nn.Linear, colbert_linear: nn.Linear
    ) -> None:
        super().__init__()
        self.model, self.sparse_linear, self.colbert_linear = model, sparse_linear, colbert_linear

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden: torch.Tensor = self.call(
            self.model, input_ids, attention_mask, token_type_ids
        ).last_hidden_state
        return (
            hidden,
            torch.relu(self.sparse_linear(hidden)).squeeze(-1),
            self.colbert_linear(hidden),
        )


class LogitsGraph(TracedGraph):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return cast(
            torch.Tensor, self.call(self.model, input_ids, attention_mask, token_type_ids).logits
        )


class SpladeGraph(TracedGraph):
    """max (or sum) over real tokens of log(1 + relu(MLM logits)) (or log1p of that, sentence-transformers'
    `log1p_relu`): one vocabulary-sized vector per text, as `SpladePooling` computes it."""

    def __init__(self, model: nn.Module, strategy: str = "max", activation: str = "relu") -> None:
        super().__init__()
        self.model, self.strategy, self.activation = model, strategy, activation

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits: torch.Tensor = self.call(
            self.model, input_ids, attention_mask, token_type_ids
        ).logits
        weights = torch.log1p(torch.relu(logits)) * attention_mask.unsqueeze(-1).to(logits.dtype)
        if self.activation == "log1p_relu":
            weights = torch.log1p(weights)
        return weights.sum(dim=1) if self.strategy == "sum" else weights.max(dim=1).values


class SentenceEmbeddingGraph(TracedGraph):
    """The transformer, then the model's own sentence-transformers modules after it (Pooling, each
    Dense): `sentence_embedding` as `SentenceTransformer.encode` computes it before Normalize, and
    the hidden states (for `/embed_all`)."""

    def __init__(self, model: nn.Module, modules: list[nn.Module]) -> None:
        super().__init__()
        self.model, self.modules_after = model, nn.ModuleList(modules)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden: torch.Tensor = self.call(
            self.model, input_ids, attention_mask, token_type_ids
        ).last_hidden_state
        features = {"token_embeddings": hidden, "attention_mask": self.pooling_mask(attention_mask)}
        for module in self.modules_after:
            features = module(features)
        return hidden, features["sentence_embedding"]


class YesNoGraph(TracedGraph):
    """A causal LM reranker (Qwen3-Reranker): the decoder, then only the "no" and "yes" rows of its
    LM head at each row's last real token. `logits` = logit(yes) - logit(no), [rows, 1]."""

    def __init__(self, causal_lm: Any, no_id: int, yes_id: int) -> None:
        super().__init__()
        self.model = cast(nn.Module, causal_lm.model)
        head = causal_lm.get_output_embeddings()
        self.head = nn.Linear(head.weight.shape[1], 2, bias=getattr(head, "bias", None) is not None)
        with torch.no_grad():  # a copy of the two rows, tied to the embeddings or not
            self.head.weight.copy_(head.weight[[no_id, yes_id]])
            if self.head.bias is not None:
                self.head.bias.copy_(head.bias[[no_id, yes_id]])

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.call(
            self.model, input_ids, attention_mask, None
        ).last_hidden_state
        positions = torch.cumsum(torch.ones_like(input_ids), 1) - 1
        # the last real token, either padding side
        last = (positions * attention_mask).max(dim=1).values
        picked = torch.gather(
            hidden, 1, last[:, None, None].expand(-1, 1, hidden.shape[-1])
        ).squeeze(1)
        no_yes: torch.Tensor = self.head(picked)
        return (no_yes[:, 1] - no_yes[:, 0]).unsqueeze(-1)


class LateGraph(HiddenStateGraph):
    """The transformer, then each projection: one vector per token. The mask's expansion tokens
    (`contract.UNATTENDED_TOKEN`) are read but attended to by no token."""

    def __init__(self, model: nn.Module, projections: list[nn.Module]) -> None:
        super().__init__(model)
        self.projections = nn.ModuleList(projections)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        keys = ((attention_mask > 0) & (attention_mask != contract.UNATTENDED_TOKEN)).to(
            attention_mask.dtype
        )
        vectors = super().forward(input_ids, keys, token_type_ids)
        for projection in self.projections:
            vectors = projection(vectors)
        return vectors


def load_head(path: Path, hidden: int, out_features: int) -> nn.Linear:
    """bge-m3 head weights; `weights_only` so a model directory can never run pickled code."""
    head = nn.Linear(hidden, out_features)
    with refusing_pickled_code(path.name):
        head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return head.eval()


def with_its_own_head(auto: Any, model_dir: Path, head: str, options: dict[str, Any]) -> Any:
    """`auto.from_pretrained`, refused by name when the checkpoint lacks weights the head needs:
    transformers would initialise them at random and the export would serve noise (an embedder
    asked for as `--task rerank`, a bare encoder as `--task splade`)."""
    model, loading = auto.from_pretrained(model_dir, output_loading_info=True, **options)
    if loading["missing_keys"]:
        missing = sorted(loading["missing_keys"])
        raise SourceError(
            f"{model_dir.name} has no {head} in its weights (missing {', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): transformers would initialise it at random; "
            "export it for what it was trained as (drop --task, or pick the task its card names)"
        )
    return model.eval()  # a transformers PreTrainedModel


def build_graph(
    kind: Layout, model_dir: Path, attn: str = "eager"
) -> tuple[nn.Module, list[GraphOutput]]:
    """Load the Hugging Face model with the head whose outputs `kind`'s pool stage reads, and wrap
    it; also say what the graph outputs."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    options = {"attn_implementation": attn, **pretrained_options(model_dir)}
    with refusing_pickled_code(f"the model weights in {model_dir.name}"):
        if contract.LOGITS in kind.graph_outputs:
            model = with_its_own_head(
                AutoModelForSequenceClassification, model_dir, "classification head", options
            )
            return LogitsGraph(model), [
                GraphOutput(contract.LOGITS, [model.config.num_labels], False)
            ]
        if contract.SPLADE_WEIGHTS in kind.graph_outputs:
            model = with_its_own_head(AutoModelForMaskedLM, model_dir, "masked-LM head", options)
            return SpladeGraph(model), [
                GraphOutput(contract.SPLADE_WEIGHTS, [model.config.vocab_size], False)
            ]
        try:  # the pooler is never used; BERT-like models let us skip loading it
            model = AutoModel.from_pretrained(model_dir, add_pooling_layer=False, **options).eval()
        except TypeError:
            model = AutoModel.from_pretrained(model_dir, **options).eval()
    hidden = model.config.hidden_size
    state = GraphOutput(contract.LAST_HIDDEN_STATE, [-1, hidden], True)
    if contract.TOKEN_WEIGHTS in kind.graph_outputs:  # bge-m3's heads
        sparse = load_head(model_dir / "sparse_linear.pt", hidden, 1)
        colbert = load_head(model_dir / "colbert_linear.pt", hidden, hidden)
        return M3Graph(model, sparse, colbert), [
            state,
            GraphOutput(contract.TOKEN_WEIGHTS, [-1], True),
            GraphOutput(contract.COLBERT_VECS, [-1, hidden], True),
        ]
    return HiddenStateGraph(model), [state]
