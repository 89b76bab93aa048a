"""`prensa.json`: what an export directory holds, read by `prensa repo build` and the gateway."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from prensa.stages import contract

MANIFEST_FILE = "prensa.json"
CALIBRATION_FILE = "calibration.json"  # int8/uint8 embedding ranges; `prensa repo build` puts it beside the tokenizer
FORMAT_VERSION = 1  # optional fields have defaults: prensa.json files without them still read


class Task(StrEnum):  # formats as its value: "rerank", in messages and JSON alike
    EMBED = "embed"  # pooled dense vectors (sentence-transformers style)
    M3 = "m3"  # bge-m3: dense + sparse lexical weights + ColBERT from one pass
    RERANK = "rerank"  # cross-encoder, one logit per (query, passage)
    CLASSIFY = "classify"  # sequence classifier, one logit per label
    SPLADE = "splade"  # masked-LM expansion into vocabulary weights
    LATE = "late"  # late interaction (PyLate, ColBERT): one vector per kept token, MaxSim scores


class PairTruncation(StrEnum):
    """How a (query, document) pair too long for the model is cut (`contract.PAIR_TRUNCATIONS`)."""

    LONGEST_FIRST = contract.LONGEST_FIRST  # TEI, sentence-transformers' CrossEncoder, transformers
    CAPPED_QUERY = (
        contract.CAPPED_QUERY
    )  # FlagEmbedding's FlagReranker: the query keeps at most 3/4


class Pooling(str, Enum):
    CLS = "cls"
    MEAN = "mean"
    LAST = "last"


@dataclass
class GraphOutput:
    name: str
    dims: list[int]  # without the batch axis; -1 marks the token axis
    per_token: bool


@dataclass
class EngineProfile:
    """The one TensorRT optimization profile an engine was built with: the shapes it accepts."""

    min_batch: int
    opt_batch: int
    max_batch: int
    min_length: int
    opt_length: int
    max_length: int


@dataclass
class TensorRTEngine:
    file: str  # serialized engine beside the ONNX graph, e.g. model.plan
    precision: str  # fp16 (LayerNorm and softmax in fp32) or fp32
    tensorrt_version: (
        str  # an engine loads only in this TensorRT version, on the GPU kind it was built on
    )
    profile: EngineProfile


@dataclass
class LateInteraction:
    """How a late-interaction model frames queries and documents, as PyLate does: a marker token
    after the first special token, queries cut (and with `expand_queries` padded with `mask_id`) to
    `query_length`, documents cut to the manifest's max length with `skiplist_ids` left out of
    their vectors. The export writes the document framing into the tokenizer file and the query
    framing into `query_tokenizer_file`."""

    query_marker_id: int
    document_marker_id: int
    query_length: int
    mask_id: int
    expand_queries: bool
    attend_to_expansion: bool
    skiplist_ids: list[int]
    query_tokenizer_file: str = "query_tokenizer.json"


@dataclass
class Manifest:
    task: Task
    source: str  # Hugging Face id or the directory it came from
    revision: str  # Hub commit sha, or a content hash of a local directory's weights
    max_length: int
    onnx_file: str
    dtype: str
    inputs: list[str]
    outputs: list[GraphOutput]
    tokenizer_file: str = "tokenizer.json"
    pad_id: int = 0
    special_ids: list[int] = field(default_factory=list)
    pooling: Pooling | None = None
    # sentence-transformers' Pooling (and Dense) modules traced into the graph, which outputs
    # `sentence_embedding`: their pooling modes ("mean", "cls+max"); `pooling` is then None.
    graph_pooling: str | None = None
    normalize: bool = True
    dim: int | None = None  # dense dimension
    id2label: dict[int, str] = field(default_factory=dict)
    tensorrt: TensorRTEngine | None = None  # set by `prensa export --format tensorrt`
    fused_ops: dict[str, int] = field(default_factory=dict)  # onnxruntime-only kernels in the graph
    # sentence-transformers prompt name -> text to prepend
    prompts: dict[str, str] = field(default_factory=dict)
    # the prompt sentence-transformers applies when none is named
    default_prompt_name: str | None = None
    # sentence-transformers' Pooling `include_prompt`: false leaves a prompt's tokens out of the pooling,
    # which the graph and pool stage do for tokens marked `contract.PROMPT_TOKEN`.
    include_prompt: bool = True
    # Where the model's vectors may be cut (`dimensions`): its declared Matryoshka sizes, [] when it
    # declares Matryoshka training without a list, None when it declares none (see `pipeline.read_matryoshka`).
    matryoshka_dimensions: list[int] | None = None
    calibration_file: str | None = None  # dense int8 ranges (CALIBRATION_FILE), for dense tasks
    # the transformer's; with max_length, what one text's attention can hold
    attention_heads: int | None = None
    # LLM rerankers (Qwen3-Reranker): how a pair becomes one text, the tokenize stage's `PairTemplate`'s
    # fields (prefix, suffix, format, instruction).
    pair_template: dict[str, str] | None = None
    # rerank and classify: how a pair too long for max_length is cut (the tokenize stage's rule)
    pair_truncation: PairTruncation = PairTruncation.LONGEST_FIRST
    # the graph in onnxruntime's packing mode, for its CUDA provider
    # (`prensa.export.formats.packing`), and whether the export could check it against the unpacked
    # graph on a CUDA GPU
    packed_file: str | None = None
    packed_checked: bool = False
    late_interaction: LateInteraction | None = None  # late-interaction models only
    # each text stripped before tokenizing, as the reference library reads it (`contract.STRIP_TEXTS`);
    # false in exports made before prensa read it
    strip_texts: bool = False
    format_version: int = FORMAT_VERSION

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST_FILE
        data = asdict(self)
        data["task"] = self.task.value
        data["pooling"] = self.pooling.value if self.pooling else None
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"{directory} is not a prensa export (no {MANIFEST_FILE}); run `prensa export` first"
            )
        data = json.loads(path.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path}: format_version {data.get('format_version')} is not {FORMAT_VERSION}; re-export"
            )
        data["task"] = Task(data["task"])
        data["pooling"] = Pooling(data["pooling"]) if data.get("pooling") else None
        if "pair_truncation" in data:
            data["pair_truncation"] = PairTruncation(data["pair_truncation"])
        data["outputs"] = [GraphOutput(**o) for o in data["outputs"]]
        data["id2label"] = {int(k): v for k, v in data.get("id2label", {}).items()}
        if data.get("tensorrt"):
            engine = data["tensorrt"]
            data["tensorrt"] = TensorRTEngine(
                **{**engine, "profile": EngineProfile(**engine["profile"])}
            )
        if data.get("late_interaction"):
            data["late_interaction"] = LateInteraction(**data["late_interaction"])
        return cls(**data)


def read_dense_ranges(directory: Path) -> npt.NDArray[Any] | None:
    """The `dense_ranges` of `directory`'s CALIBRATION_FILE as a [2, dim] float32 array, or None
    without one: the export's, or the copy `prensa repo build` puts beside the tokenizer file."""
    path = directory / CALIBRATION_FILE
    if not path.is_file():
        return None
    return np.asarray(json.loads(path.read_text())["dense_ranges"], dtype=np.float32)
