"""int8/uint8 embedding ranges: per-dimension [min; max] of a model's served dense vectors over a
fixed corpus, written to `calibration.json` in the export.

The gateway quantises as sentence-transformers' `quantize_embeddings(emb, "int8", ranges=R)` does.
Ranges fixed per model make a text's int8 vector independent of the texts sent beside it; ranges
taken from each request's own batch would not be.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from prensa.layouts import of_manifest
from prensa.manifest import CALIBRATION_FILE, Manifest, Pooling
from prensa.stages import contract, load_stage
from prensa.workload import embedding_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CORPUS_TEXTS = 256
CORPUS_SEED = 0
# What calibration files record their corpus as: the call that makes it.
CORPUS = f"prensa.workload.embedding_texts({CORPUS_TEXTS}, seed={CORPUS_SEED})"
MAX_TOKENS = 256  # bounds the CPU time of long-context models; most of the corpus fits within it
BATCH_ROWS = 32  # length-sorted, so little padding
FIGURE = "calibration"  # the export report's line; not "int8 ...", which names the quantised graph's lines
# `prensa export` calibrates by itself up to this size (base-size encoders: seconds on a CPU). Past it
# the corpus costs minutes on a CPU, more than the rest of a large model's export (docs/performance.md),
# so larger models are calibrated when asked: `--calibrate`, or `prensa calibrate` on the export later.
AUTO_MAX_PARAMETERS = 150_000_000

# tokenizer output -> graph outputs by name
Run = Callable[[Mapping[str, npt.NDArray[Any]]], dict[str, npt.NDArray[Any]]]


class CalibrationUnavailable(RuntimeError):
    """onnxruntime's CPU provider cannot run the served graph; the message says why."""


@dataclass(frozen=True)
class Calibration:
    ranges: npt.NDArray[Any]  # [2, dim]: per-dimension minimum, then maximum
    texts: int
    max_tokens: int
    rows: int  # texts per forward pass


def graph_parameters(graph: Path) -> int:
    """Weights in an ONNX graph (its initializers' elements), read without loading them."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sum(int(np.prod(t.dims, dtype=np.int64)) for t in model.graph.initializer)


def skip_reason(requested: bool | None, parameters: int) -> str | None:
    """Why an export leaves calibration out (None: it calibrates): not asked for, or left to the user
    past AUTO_MAX_PARAMETERS when the export was not told either way."""
    if requested is False:
        return "skipped (--no-calibrate)"
    if requested is None and parameters > AUTO_MAX_PARAMETERS:
        return (
            f"skipped: {parameters / 1e6:.0f}M parameters cost minutes on a CPU; int8/uint8 embeddings need "
            "it: run `prensa calibrate` on this export (or export with --calibrate)"
        )
    return None


def served_dense(
    outputs: Mapping[str, npt.NDArray[Any]],
    tokens: Mapping[str, npt.NDArray[Any]],
    pooling: Pooling | None,
    normalize: bool,
) -> npt.NDArray[Any]:
    """The dense vectors clients receive from an encoder's outputs on right-padded `tokens`, through
    the pool stage itself (`pooling` None: the graph pools)."""
    ids = {name: np.asarray(value, dtype=np.int64) for name, value in tokens.items()}
    pooled = load_stage("pool").pool_request(
        {**ids, **outputs},
        pooling.value if pooling else "none",
        normalize,
        np.zeros(0, dtype=np.int64),
        "sigmoid",
    )
    return cast(npt.NDArray[Any], pooled[contract.DENSE])


def calibration_texts() -> list[str]:
    return embedding_texts(CORPUS_TEXTS, seed=CORPUS_SEED)


def embed_texts(
    run: Run,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    pooling: Pooling | None,
    normalize: bool,
    max_tokens: int,
    rows: int,
) -> npt.NDArray[Any]:
    """Served dense vectors of `texts`, in their order, through the pool stage (`pooling` None: the
    graph pools); run `rows` at a time, shortest first, padded on the right as the stages pad."""
    lengths = [
        len(ids)
        for ids in tokenizer(texts, truncation=True, max_length=max_tokens)[contract.INPUT_IDS]
    ]
    order = np.argsort(lengths, kind="stable")
    vectors: list[npt.NDArray[Any] | None] = [None] * len(texts)
    for start in range(0, len(texts), rows):
        chosen = order[start : start + rows]
        encoded = tokenizer(
            [texts[i] for i in chosen],
            padding=True,
            truncation=True,
            max_length=max_tokens,
            return_tensors="np",
            padding_side="right",
        )
        dense = served_dense(run(encoded), encoded, pooling, normalize)
        for i, vector in zip(chosen, dense.astype(np.float32)):
            vectors[i] = vector
    # every slot is filled: `order` covers every text
    return np.stack(cast(list[npt.NDArray[Any]], vectors))


def dense_ranges(vectors: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """What sentence-transformers' `quantize_embeddings` computes from `calibration_embeddings`."""
    return np.vstack((vectors.min(axis=0), vectors.max(axis=0)))


def calibrate(
    export_dir: Path, manifest: Manifest, tokenizer: PreTrainedTokenizerBase
) -> Calibration:
    """Ranges of the export's own graph (the one served: fp32, fp16 or int8) on onnxruntime's CPU
    provider, with rows per pass as the encoder runs them (int8 graphs one row at a time)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, Fail
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

    from prensa.export.graph_runner import GraphRunner
    from prensa.triton.repo import ServingOptions, encoder_rows

    if not of_manifest(manifest).dense:
        raise ValueError(f"{manifest.task.value} exports have no dense vectors to calibrate")
    rows = encoder_rows(manifest, ServingOptions(max_batch_size=BATCH_ROWS))
    max_tokens = min(manifest.max_length, MAX_TOKENS)
    try:
        run = GraphRunner(export_dir / manifest.onnx_file, manifest.inputs)
        vectors = embed_texts(
            run,
            tokenizer,
            calibration_texts(),
            manifest.pooling,
            manifest.normalize,
            max_tokens,
            rows,
        )
    except (EPFail, Fail, NoKernel) as exc:  # e.g. an fp16 op without a CPU kernel
        raise CalibrationUnavailable(
            f"CPUExecutionProvider cannot run this graph: {str(exc).splitlines()[0]}"
        ) from exc
    if not np.isfinite(vectors).all():
        raise CalibrationUnavailable("the graph's dense vectors are not all finite")
    return Calibration(dense_ranges(vectors), CORPUS_TEXTS, max_tokens, rows)


def _float32(values: npt.NDArray[Any]) -> list[float]:
    """Shortest decimals that read back as the same float32."""
    return [float(str(v)) for v in values.astype(np.float32)]


def write_calibration(export_dir: Path, calibration: Calibration, manifest: Manifest) -> str:
    """`calibration.json`; `dense_ranges` is what the gateway reads, the rest says what it describes."""
    data = {
        "dense_ranges": [_float32(row) for row in calibration.ranges],
        "texts": calibration.texts,
        "corpus": CORPUS,
        "max_tokens": calibration.max_tokens,
        "rows_per_pass": calibration.rows,
        "pooling": manifest.pooling.value if manifest.pooling else None,
        "normalize": manifest.normalize,
        "dtype": manifest.dtype,
    }
    (export_dir / CALIBRATION_FILE).write_text(json.dumps(data) + "\n")
    return CALIBRATION_FILE


def describe(calibration: Calibration) -> str:
    dim = calibration.ranges.shape[1]
    return (
        f"int8 embedding ranges: {calibration.texts} texts (<= {calibration.max_tokens} tokens, "
        f"{calibration.rows} per pass), {dim} dims -> {CALIBRATION_FILE}"
    )


def calibrate_export(export_dir: Path) -> Calibration:
    """Ranges for an existing export (`prensa calibrate`): calibration.json written and named in its
    manifest, as `prensa export --calibrate` would have."""
    from transformers import AutoTokenizer

    manifest = Manifest.read(export_dir)
    # transformers leaves from_pretrained unannotated; there is no typed way to call it.
    tokenizer = AutoTokenizer.from_pretrained(export_dir, use_fast=True, trust_remote_code=False)  # type: ignore[no-untyped-call]
    result = calibrate(export_dir, manifest, tokenizer)
    manifest.calibration_file = write_calibration(export_dir, result, manifest)
    manifest.write(export_dir)
    return result
