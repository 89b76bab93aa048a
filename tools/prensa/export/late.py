"""Late-interaction models read as PyLate reads them, or refused by name.

Two layouts: PyLate's sentence-transformers directory (a Transformer, then PyLate's `Dense`
projections, its settings in `config_sentence_transformers.json`) and the original ColBERT
checkpoint (`HF_ColBERT`: a BERT whose `linear.weight` projects each token, its settings in
`artifact.metadata`). Either is served as PyLate's `encode` answers: the graph is the transformer
and its projections, one vector per token; the tokenizer files frame queries and documents with
the model's marker token; the pool stage keeps and normalises the vectors PyLate keeps
(`contract.late_kept`). Anything PyLate would do otherwise (a marker missing from the vocabulary,
which PyLate adds with a random embedding; a residual projection; a non-torch activation) is
refused at export.
"""

from __future__ import annotations

import importlib
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from prensa.export.safe_load import refusing_pickled_code
from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import MODULES_FILE, TRANSFORMERS, DenseLayer, class_name, read_dense
from prensa.manifest import GraphOutput, LateInteraction
from prensa.stages import contract

if TYPE_CHECKING:  # torch is the export extra's: imported where a graph is built
    import torch
    from torch import nn

    from prensa.export.graphs import LateGraph

STANFORD_ARCHITECTURE = "HF_ColBERT"
STANFORD_METADATA = "artifact.metadata"
PYLATE_CONFIG = "config_sentence_transformers.json"
# PyLate's own defaults, where a model's files say nothing (its ColBERT constructor)
PYLATE_QUERY_PREFIX, PYLATE_DOCUMENT_PREFIX = "[Q] ", "[D] "
STANFORD_QUERY_PREFIX, STANFORD_DOCUMENT_PREFIX = "[unused0]", "[unused1]"
DEFAULT_QUERY_LENGTH, DEFAULT_DOCUMENT_LENGTH = 32, 180


@dataclass(frozen=True)
class LateLayout:
    """What PyLate runs after the transformer, and how it frames queries and documents."""

    projections: tuple[DenseLayer, ...]  # PyLate's Dense modules, in order
    stanford_projection: tuple[int, int] | None  # HF_ColBERT's `linear.weight` shape (out, in)
    query_prefix: str
    document_prefix: str
    query_length: int
    document_length: int
    expand_queries: bool
    attend_to_expansion: bool
    skiplist_words: tuple[str, ...]


def _json(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(path.read_text())) if path.is_file() else {}


def _setting(config: dict[str, Any], key: str, default: Any) -> Any:
    value = config.get(key)
    return default if value is None else value


def _pylate_modules(source: SourceModel) -> list[dict[str, Any]] | None:
    """The modules after the transformer of a PyLate directory, or None for any other directory."""
    if not source.has(MODULES_FILE):
        return None
    entries = json.loads((source.path / MODULES_FILE).read_text())
    if not isinstance(entries, list) or not any(
        str(e.get("type", "")).startswith("pylate.") for e in entries
    ):
        return None
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    if class_name(str(entries[0].get("type", ""))) not in TRANSFORMERS:
        raise SourceError(f"{source.name}: a PyLate model whose first module is not a Transformer")
    for entry in entries[1:]:
        if class_name(str(entry.get("type", ""))) != "Dense":
            raise SourceError(
                f"{source.name}: module {entry.get('path')} of type {entry.get('type')} follows the "
                "transformer; prensa serves PyLate models whose modules after it are Dense projections"
            )
    return cast(list[dict[str, Any]], entries[1:])


def read_late_layout(source: SourceModel, architectures: list[str]) -> LateLayout | None:
    """The late-interaction layout of `source`, or None when it is not a late-interaction model."""
    stanford = STANFORD_ARCHITECTURE in architectures
    modules = None if stanford else _pylate_modules(source)
    if not stanford and modules is None:
        return None
    if stanford:
        meta = _json(source.path / STANFORD_METADATA)
        config = {
            "query_prefix": meta.get("query_token_id") or STANFORD_QUERY_PREFIX,
            "document_prefix": meta.get("doc_token_id") or STANFORD_DOCUMENT_PREFIX,
            "query_length": meta.get("query_maxlen"),
            "document_length": meta.get("doc_maxlen"),
            "attend_to_expansion_tokens": meta.get("attend_to_mask_tokens"),
        }
        projections: tuple[DenseLayer, ...] = ()
        shape = _stanford_projection(source).shape
        stanford_projection: tuple[int, int] | None = (int(shape[0]), int(shape[1]))
    else:
        config = _json(source.path / PYLATE_CONFIG)
        projections = tuple(_projection(source, entry) for entry in modules or [])
        stanford_projection = None
    expand = bool(_setting(config, "do_query_expansion", True))
    layout = LateLayout(
        projections=projections,
        stanford_projection=stanford_projection,
        query_prefix=str(_setting(config, "query_prefix", PYLATE_QUERY_PREFIX)),
        document_prefix=str(_setting(config, "document_prefix", PYLATE_DOCUMENT_PREFIX)),
        query_length=int(_setting(config, "query_length", DEFAULT_QUERY_LENGTH)),
        document_length=int(_setting(config, "document_length", DEFAULT_DOCUMENT_LENGTH)),
        expand_queries=expand,
        attend_to_expansion=expand and bool(_setting(config, "attend_to_expansion_tokens", False)),
        skiplist_words=tuple(_setting(config, "skiplist_words", list(string.punctuation))),
    )
    if not layout.query_prefix or not layout.document_prefix:
        raise SourceError(
            f"{source.name}: a late-interaction model without query and document prefix tokens; "
            "prensa tells queries from documents by them"
        )
    return layout


def _projection(source: SourceModel, entry: dict[str, Any]) -> DenseLayer:
    config = _json(source.path / str(entry["path"]) / "config.json")
    if config.get("use_residual"):
        raise SourceError(
            f"{source.name}: module {entry['path']} (PyLate Dense) adds a residual projection, "
            "which prensa does not serve"
        )
    return read_dense(source, entry)


def _stanford_projection(source: SourceModel) -> torch.Tensor:
    """HF_ColBERT's `linear.weight`, from the checkpoint's safetensors (else its pickle-free .bin)."""
    import torch

    if source.has("model.safetensors"):
        from safetensors import safe_open

        with safe_open(str(source.path / "model.safetensors"), framework="pt") as weights:
            if "linear.weight" in weights.keys():  # noqa: SIM118 - safe_open has no __contains__
                return cast(torch.Tensor, weights.get_tensor("linear.weight"))
    elif source.has("pytorch_model.bin"):
        with refusing_pickled_code("pytorch_model.bin"):
            state = torch.load(
                source.path / "pytorch_model.bin", map_location="cpu", weights_only=True
            )
        if "linear.weight" in state:
            return cast(torch.Tensor, state["linear.weight"])
    raise SourceError(
        f"{source.name}: an {STANFORD_ARCHITECTURE} checkpoint without `linear.weight`, its projection"
    )


def interaction(layout: LateLayout, tokenizer: Any, name: str) -> LateInteraction:
    """The token ids the stages and the gateway need, from the model's own (Hugging Face) tokenizer,
    as PyLate converts them; a marker PyLate would add to the vocabulary is refused."""
    vocab = tokenizer.get_vocab()
    missing = [p for p in (layout.query_prefix, layout.document_prefix) if p not in vocab]
    if missing:
        raise SourceError(
            f"{name}: its tokenizer lacks the prefix token(s) {missing}, which PyLate adds with a "
            "random embedding; save the model with PyLate first so that they are part of it"
        )
    mask_id = tokenizer.mask_token_id
    if mask_id is None:  # PyLate pads queries with the EOS token where there is no mask token
        mask_id = tokenizer.eos_token_id
    if mask_id is None and layout.expand_queries:
        raise SourceError(
            f"{name}: query expansion needs a mask or EOS token, and its tokenizer has neither"
        )
    return LateInteraction(
        query_marker_id=int(tokenizer.convert_tokens_to_ids(layout.query_prefix)),
        document_marker_id=int(tokenizer.convert_tokens_to_ids(layout.document_prefix)),
        query_length=layout.query_length,
        mask_id=int(mask_id or 0),
        expand_queries=layout.expand_queries,
        attend_to_expansion=layout.attend_to_expansion,
        skiplist_ids=sorted(
            {int(tokenizer.convert_tokens_to_ids(w)) for w in layout.skiplist_words}
        ),
    )


def _activation(path: str) -> nn.Module:
    """A torch activation from its class path (`read_dense` lets no other through)."""
    module_name, _, class_ = path.rpartition(".")
    return cast("nn.Module", getattr(importlib.import_module(module_name), class_)())


def late_graph(source: SourceModel, layout: LateLayout) -> tuple[LateGraph, list[GraphOutput]]:
    """The module to trace and its one output, `colbert_vecs` [tokens, dim]."""
    import torch
    from safetensors.torch import load_file
    from torch import nn
    from transformers import AutoModel

    from prensa.export.graphs import LateGraph
    from prensa.export.safe_load import pretrained_options

    options = {"attn_implementation": "eager", **pretrained_options(source.path)}
    with refusing_pickled_code(f"the model weights in {source.name}"):
        try:  # the pooler is never used
            model = AutoModel.from_pretrained(source.path, add_pooling_layer=False, **options)
        except TypeError:
            model = AutoModel.from_pretrained(source.path, **options)
    projections: list[nn.Module] = []
    if layout.stanford_projection is not None:
        out_features, in_features = layout.stanford_projection
        linear = nn.Linear(in_features, out_features, bias=False)
        linear.weight.data = _stanford_projection(source).to(torch.float32)
        projections.append(linear)
    for dense in layout.projections:
        folder = source.path / dense.path
        linear = nn.Linear(dense.in_features, dense.out_features, bias=dense.bias)
        if (folder / "model.safetensors").is_file():
            state = load_file(str(folder / "model.safetensors"))
        else:
            with refusing_pickled_code(f"{dense.path}/pytorch_model.bin"):
                state = torch.load(
                    folder / "pytorch_model.bin", map_location="cpu", weights_only=True
                )
        linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
        projections.extend([linear, _activation(dense.activation)])
    graph = LateGraph(model.eval(), projections).eval()
    dim = (
        layout.stanford_projection[0]
        if layout.stanford_projection
        else layout.projections[-1].out_features
    )
    return graph, [GraphOutput(contract.COLBERT_VECS, [-1, dim], True)]


def _framed_post_processor(tokenizer: Any, marker_id: int, name: str) -> dict[str, Any]:
    """The tokenizer's post-processor with the marker token after the first special token, as
    PyLate inserts it after `[CLS]`."""
    encoding = tokenizer.encode("a", add_special_tokens=True)
    flags = list(map(bool, encoding.special_tokens_mask))
    if not flags or not flags[0] or all(flags):
        raise SourceError(
            f"{name}: PyLate puts its marker after a text's first token, and this tokenizer puts no "
            "special token first; prensa does not serve such a model"
        )
    content = [i for i, special in enumerate(flags) if not special]
    lead = list(zip(encoding.ids[: content[0]], encoding.tokens[: content[0]]))
    trail = list(zip(encoding.ids[content[-1] + 1 :], encoding.tokens[content[-1] + 1 :]))
    marker = (marker_id, tokenizer.id_to_token(marker_id))

    def specials(pieces: list[tuple[int, str]], type_id: int) -> list[dict[str, Any]]:
        return [{"SpecialToken": {"id": token, "type_id": type_id}} for _, token in pieces]

    single = [
        *specials([lead[0], marker, *lead[1:]], 0),
        {"Sequence": {"id": "A", "type_id": 0}},
        *specials(trail, 0),
    ]
    pair = [*single, {"Sequence": {"id": "B", "type_id": 1}}, *specials(trail, 1)]
    tokens = {
        token: {"id": token, "ids": [i], "tokens": [token]} for i, token in [*lead, marker, *trail]
    }
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": tokens}


def write_tokenizers(
    directory: Path, tokenizer_file: str, late: LateInteraction, name: str
) -> None:
    """Frame the exported tokenizer file for documents, and write the query one beside it: the
    query marker, cut at the query length and (with expansion) padded to it with the mask token."""
    from tokenizers import Tokenizer

    path = directory / tokenizer_file
    data = json.loads(path.read_text())
    plain = Tokenizer.from_str(json.dumps(data))
    plain.no_truncation()
    plain.no_padding()
    for marker, target in (
        (late.document_marker_id, path),
        (late.query_marker_id, directory / late.query_tokenizer_file),
    ):
        framed = Tokenizer.from_str(
            json.dumps({**data, "post_processor": _framed_post_processor(plain, marker, name)})
        )
        framed.no_truncation()
        framed.no_padding()
        if target != path:
            framed.enable_truncation(late.query_length)
            if late.expand_queries:
                framed.enable_padding(
                    length=late.query_length,
                    pad_id=late.mask_id,
                    pad_token=plain.id_to_token(late.mask_id),
                )
        framed.save(str(target))
