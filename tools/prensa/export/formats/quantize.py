"""int8 for CPUs: onnxruntime dynamic quantisation, checked against fp32 on the bench workload.

Both per-tensor and per-channel weight scales are tried; the one closer to fp32 is kept, and
the figures of both are reported so the choice is visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from prensa.export.formats.calibration import served_dense
from prensa.export.graph_runner import GraphRunner
from prensa.layouts import Layout
from prensa.manifest import Pooling
from prensa.stages import contract, load_stage
from prensa.workload import embedding_texts, rerank_cases

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EMBED_SAMPLES = 48
RERANK_QUERIES, RERANK_PASSAGES = 6, 8


@dataclass(frozen=True)
class QuantizeReport:
    """Agreement with fp32 for each weight-scale granularity tried; `per_channel` is the one kept."""

    per_channel: bool
    figures: dict[str, dict[str, float]]  # "per-tensor" / "per-channel" -> metric -> value


def quantize_dynamic_int8(
    fp32: Path, int8: Path, per_channel: bool, external: bool = False
) -> None:
    """`fp32` (external data beside it read through the graph) quantised to `int8`, whose weights
    go to one `<name>.data` file when asked or when they do not fit a protobuf."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from prensa.export.formats.graph_store import PROTOBUF_LIMIT, data_file
    from prensa.files import graph_data_files

    data_file(int8).unlink(missing_ok=True)  # onnx appends to an existing data file
    # int8 weights take a quarter of fp32's bytes, but embeddings and unquantised ops keep theirs: from
    # twice the limit in fp32 on, the int8 graph may not fit a protobuf.
    fp32_bytes = sum(
        (fp32.parent / name).stat().st_size for name in (fp32.name, *graph_data_files(fp32))
    )
    external = external or fp32_bytes >= 2 * PROTOBUF_LIMIT
    # ONNX shape inference cannot see through onnxruntime's fused ops (export/formats/fusion.py);
    # the tensors it leaves untyped there are fp32.
    quantize_dynamic(
        str(fp32),
        str(int8),
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        use_external_data_format=external,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return cast(
        npt.NDArray[Any],
        (a * b).sum(-1)
        / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12),
    )


def _kendall_tau(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    sign_a = np.sign(a[:, None] - a[None, :])
    sign_b = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), 1)
    return float((sign_a[upper] * sign_b[upper]).mean())


def _vectors(
    run: GraphRunner,
    tokenizer: PreTrainedTokenizerBase,
    kind: Layout,
    pooling: Pooling | None,
    max_length: int,
) -> npt.NDArray[Any]:
    pool = load_stage("pool")
    rows = []
    for text in embedding_texts(EMBED_SAMPLES, seed=7):
        encoded = tokenizer(text, truncation=True, max_length=max_length, return_tensors="np")
        out = run(encoded)
        if contract.SPLADE_WEIGHTS in kind.graph_outputs:
            rows.append(out[contract.SPLADE_WEIGHTS][0])
        elif kind.named_labels:
            rows.append(pool.activate(out[contract.LOGITS], "softmax")[0])
        else:  # the vectors clients receive, unnormalised: cosines compare them alike
            rows.append(served_dense(out, encoded, pooling, normalize=False)[0])
    return np.stack(rows)


def _rerank_scores(
    run: GraphRunner,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    template: dict[str, str] | None,
) -> list[npt.NDArray[Any]]:
    """Each query's scores of its passages, one pair at a time; an LLM reranker's pairs written into its prompt."""
    from prensa.export import llm_reranker

    scores = []
    for case in rerank_cases(RERANK_QUERIES, RERANK_PASSAGES, seed=7):
        row = []
        for passage in case.passages:
            encoded = (
                llm_reranker.sample_rows(tokenizer, template, [case.query], [passage], max_length)
                if template
                else tokenizer(
                    case.query,
                    passage,
                    truncation=True,  # longest_first: short pairs here, cut by no rule
                    max_length=max_length,
                    return_tensors="np",
                )
            )
            row.append(float(run(encoded)[contract.LOGITS][0, 0]))
        scores.append(np.asarray(row))
    return scores


Outputs = npt.NDArray[Any] | list[npt.NDArray[Any]]  # vectors [texts, dim], or each query's scores


def served_outputs(
    run: GraphRunner,
    tokenizer: PreTrainedTokenizerBase,
    kind: Layout,
    pooling: Pooling | None,
    max_length: int,
    template: dict[str, str] | None = None,
) -> Outputs:
    """What clients receive from `run` on the workload: rerank scores per query, else vectors."""
    if kind.scores_pairs:
        return _rerank_scores(run, tokenizer, max_length, template)
    return _vectors(run, tokenizer, kind, pooling, max_length)


def agreement(want: Outputs, got: Outputs, kind: Layout) -> dict[str, float]:
    """int8 outputs `got` against fp32's `want`: ranking agreement for rerankers, cosine otherwise."""
    if isinstance(want, list) and isinstance(got, list):
        taus = [_kendall_tau(w, g) for w, g in zip(want, got)]
        top1 = [int(np.argmax(w) == np.argmax(g)) for w, g in zip(want, got)]
        return {
            "kendall_tau_mean": float(np.mean(taus)),
            "kendall_tau_min": float(np.min(taus)),
            "top1_agreement": float(np.mean(top1)),
        }
    assert not isinstance(want, list) and not isinstance(got, list)
    cosines = _cosine(want, got)
    figures = {"cosine_mean": float(cosines.mean()), "cosine_min": float(cosines.min())}
    if kind.named_labels:
        figures["label_agreement"] = float((want.argmax(-1) == got.argmax(-1)).mean())
    return figures


def quantize_with_report(
    fp32: Path,
    int8: Path,
    inputs: list[str],
    tokenizer: PreTrainedTokenizerBase,
    kind: Layout,
    pooling: Pooling | None,
    max_length: int,
    external: bool = False,
    template: dict[str, str] | None = None,
) -> QuantizeReport:
    """Write the better of per-tensor / per-channel int8 graphs to `int8`, with both figures."""
    from prensa.export.formats.graph_store import move_graph, staging

    # once for both
    reference = served_outputs(
        GraphRunner(fp32, inputs), tokenizer, kind, pooling, max_length, template
    )
    figures, candidates = {}, {}
    with staging(int8.parent, "int8") as folder:
        for per_channel in (False, True):
            label = "per-channel" if per_channel else "per-tensor"
            # its own folder: the data file keeps its name
            candidates[per_channel] = Path(folder) / label / int8.name
            candidates[per_channel].parent.mkdir()
            quantize_dynamic_int8(fp32, candidates[per_channel], per_channel, external)
            int8_outputs = served_outputs(
                GraphRunner(candidates[per_channel], inputs),
                tokenizer,
                kind,
                pooling,
                max_length,
                template,
            )
            figures[label] = agreement(reference, int8_outputs, kind)
        headline = {
            per_channel: next(iter(figures[label].values()))
            for per_channel, label in ((False, "per-tensor"), (True, "per-channel"))
        }
        keep = headline[True] > headline[False]
        move_graph(candidates[keep], int8)
    return QuantizeReport(keep, figures)
