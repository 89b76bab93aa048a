"""A sentence-transformers directory read as sentence-transformers reads it, or refused by name.

`modules.json` lists the pipeline; each entry's class name decides (2.x-4.x write
`sentence_transformers.models.Pooling`, 5.x `sentence_transformers.sentence_transformer.modules.pooling.Pooling`).
prensa serves Transformer -> Pooling -> Dense* -> Normalize? for embedders and Transformer (or
MLMTransformer) -> SpladePooling for SPLADE; any other module, or these in another order, is refused
at export with one line naming it. Pooling configs come in two forms: 5.x's `pooling_mode` (a
string, or a list whose results are concatenated) and the legacy `pooling_mode_*` booleans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prensa.export.source import SourceError, SourceModel

MODULES_FILE = "modules.json"
# legacy key order
POOLING_MODES = (
    "cls",
    "max",
    "mean",
    "mean_sqrt_len_tokens",
    "weightedmean",
    "lasttoken",
)
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
TRANSFORMERS = ("Transformer", "MLMTransformer")
SERVED = (
    "Transformer -> Pooling -> Dense (any number) -> Normalize (optional) for embeddings, "
    "Transformer -> SpladePooling for SPLADE"
)


@dataclass(frozen=True)
class DenseLayer:
    """One `Dense` module: its folder, shape and activation (a torch class path)."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class SentenceLayout:
    """What `SentenceTransformer.encode` (or `SparseEncoder.encode`) runs after the transformer."""

    pooling_path: str | None  # the Pooling module's folder; None for SPLADE
    pooling_modes: tuple[str, ...]  # concatenated in this order
    include_prompt: bool
    dense: tuple[DenseLayer, ...]
    normalize: bool
    splade_strategy: str | None = None  # SPLADE: max or sum over tokens
    splade_activation: str | None = None  # relu or log1p_relu

    @property
    def is_splade(self) -> bool:
        return self.splade_strategy is not None

    @property
    def simple_pooling(self) -> str | None:
        """The one pooling mode the pool stage computes itself (cls, mean, lasttoken), when nothing
        else follows it but Normalize; None when the graph must pool (sentence-transformers' own
        modules traced into it)."""
        if (
            self.dense
            or len(self.pooling_modes) != 1
            or self.pooling_modes[0] not in ("cls", "mean", "lasttoken")
        ):
            return None
        return self.pooling_modes[0]


def _json(source: SourceModel, relative: str) -> Any:
    path = source.path / relative
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise SourceError(
            f"{source.name}: {MODULES_FILE} names {relative}, which is missing"
        ) from exc
    except json.JSONDecodeError as exc:
        raise SourceError(f"{source.name}: {relative} is not valid JSON ({exc})") from exc


def class_name(module_type: str) -> str:
    """`sentence_transformers.models.Pooling` and `...sentence_transformer.modules.pooling.Pooling` alike: Pooling."""
    return module_type.rsplit(".", 1)[-1]


def pooling_modes(config: dict[str, Any]) -> tuple[str, ...]:
    """5.x `pooling_mode` (string or list) or the legacy booleans, in sentence-transformers' order;
    neither given: mean, as sentence-transformers defaults."""
    mode = config.get("pooling_mode")
    if mode is not None:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(
            m
            for m in POOLING_MODES
            if config.get(f"pooling_mode_{m}")
            or config.get(f"pooling_mode_{m}_token")
            or config.get(f"pooling_mode_{m}_tokens")
        )
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not all(isinstance(m, str) for m in modes):
        raise SourceError(
            f"pooling mode {unknown or modes} is not one sentence-transformers defines "
            f"({', '.join(POOLING_MODES)})"
        )
    return modes or ("mean",)


def read_dense(source: SourceModel, entry: dict[str, Any]) -> DenseLayer:
    """A `Dense` module's folder, shape and activation, from its config (a torch activation only)."""
    config = _json(source, f"{entry['path']}/config.json")
    activation = config.get("activation_function") or "torch.nn.modules.linear.Identity"
    if not activation.startswith("torch."):
        raise SourceError(
            f"{source.name}: module {entry['path']} (Dense) uses activation {activation}, which is not "
            "a torch class; sentence-transformers itself runs it only as remote code, and prensa serves "
            "torch activations only"
        )
    return DenseLayer(
        entry["path"],
        int(config["in_features"]),
        int(config["out_features"]),
        bool(config.get("bias", True)),
        activation,
    )


def _refuse(source: SourceModel, entry: dict[str, Any], why: str) -> SourceError:
    where = entry.get("path") or "(root)"
    return SourceError(
        f"{source.name}: module {where} of type {entry.get('type')} in {MODULES_FILE} {why}; "
        f"prensa serves {SERVED}"
    )


TRANSFORMER_CONFIG = "sentence_bert_config.json"


def lowercases(source: SourceModel) -> bool:
    """Whether the sentence-transformers Transformer (the first module, PyLate's too) lowercases
    texts (`do_lower_case`): sentence-transformers then lowercases every text before its tokenizer
    reads it, whatever the tokenizer file says."""
    if not source.has(MODULES_FILE):
        return False
    entries = _json(source, MODULES_FILE)
    if not isinstance(entries, list) or not entries:
        return False
    first = min(entries, key=lambda e: int(e.get("idx", 0)))
    relative = "/".join(part for part in (str(first.get("path", "")), TRANSFORMER_CONFIG) if part)
    config = _json(source, relative) if source.has(relative) else {}
    return bool(config.get("do_lower_case", False))


def lowercase_first(tokenizer: Any) -> None:
    """Put a Lowercase normalizer in front of a fast tokenizer's own, as sentence-transformers does
    for `do_lower_case` (unless one is there): the tokenizer file then lowercases wherever it is
    read, in the tokenize stage and in the gateway alike."""
    from tokenizers import normalizers

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    parts = list(current) if isinstance(current, normalizers.Sequence) else [current]
    if any(isinstance(part, normalizers.Lowercase) for part in parts):
        return
    backend.normalizer = normalizers.Sequence(
        [normalizers.Lowercase(), *(part for part in parts if part is not None)]
    )


def read_layout(source: SourceModel) -> SentenceLayout | None:
    """The modules after the transformer, or None for a directory without `modules.json`."""
    if not source.has(MODULES_FILE):
        return None
    entries = _json(source, MODULES_FILE)
    if not isinstance(entries, list) or not entries:
        raise SourceError(f"{source.name}: {MODULES_FILE} must list the model's modules")
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    if class_name(str(entries[0].get("type", ""))) not in TRANSFORMERS:
        raise _refuse(source, entries[0], "comes first where a Transformer must")
    rest = entries[1:]
    kinds = [class_name(str(e.get("type", ""))) for e in rest]
    if kinds and kinds[0] == "SpladePooling":
        return _splade(source, rest)
    pooling: dict[str, Any] | None = None
    dense: list[DenseLayer] = []
    normalize = False
    for entry, kind in zip(rest, kinds):
        if kind == "Pooling" and pooling is None and not dense and not normalize:
            pooling = {**_json(source, f"{entry['path']}/config.json"), "path": entry["path"]}
        elif kind == "Dense" and pooling is not None and not normalize:
            dense.append(read_dense(source, entry))
        elif kind == "Normalize" and not normalize:
            normalize = True
        elif kind in ("Pooling", "Dense", "Normalize", "SpladePooling"):
            raise _refuse(source, entry, "comes in an order prensa does not serve")
        else:
            raise _refuse(source, entry, "is not served")
    if pooling is None:
        raise SourceError(
            f"{source.name}: {MODULES_FILE} has no Pooling module; prensa serves {SERVED}"
        )
    try:
        modes = pooling_modes(pooling)
    except SourceError as exc:
        raise SourceError(f"{source.name}: {pooling['path']}/config.json: {exc}") from exc
    return SentenceLayout(
        pooling["path"], modes, bool(pooling.get("include_prompt", True)), tuple(dense), normalize
    )


def _splade(source: SourceModel, rest: list[dict[str, Any]]) -> SentenceLayout:
    """Transformer -> SpladePooling: max (or sum) over tokens of relu (or log1p of relu) of the MLM logits."""
    if len(rest) != 1:
        raise _refuse(
            source, rest[1], "follows SpladePooling, which prensa serves only as the last module"
        )
    entry = rest[0]
    config = _json(source, f"{entry['path']}/config.json")
    strategy, activation = (
        config.get("pooling_strategy", "max"),
        config.get("activation_function", "relu"),
    )
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise _refuse(
            source,
            entry,
            f"asks pooling_strategy {strategy!r} with activation {activation!r}, of which "
            f"prensa serves {SPLADE_STRATEGIES} and {SPLADE_ACTIVATIONS}",
        )
    return SentenceLayout(None, (), True, (), False, strategy, activation)
