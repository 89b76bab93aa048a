"""int8 for CPUs: onnxruntime dynamic quantisation, checked against fp32 on the bench workload.

Both per-tensor and per-channel weight scales are tried; the one closer to fp32 is kept, and
the figures of both are reported so the choice is visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from prensa.manifest import Pooling, Task
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


def quantize_dynamic_int8(fp32: Path, int8: Path, per_channel: bool) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # ONNX shape inference cannot see through onnxruntime's fused ops (export/fusion.py); the
    # tensors it leaves untyped there are fp32.
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=per_channel,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


class GraphRunner:
    """Runs a graph one text (or pair) at a time: int8 results depend on batch neighbours."""

    def __init__(self, path: Path, inputs: list[str]) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = inputs

    def __call__(self, encoded: Mapping[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        values = self.session.run(None, {n: encoded[n].astype(np.int64) for n in self.inputs})
        return {meta.name: value for meta, value in zip(self.session.get_outputs(), values)}


def _cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return cast(npt.NDArray[Any], (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12))


def _kendall_tau(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    sign_a = np.sign(a[:, None] - a[None, :])
    sign_b = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), 1)
    return float((sign_a[upper] * sign_b[upper]).mean())


def _vectors(run: GraphRunner, tokenizer: PreTrainedTokenizerBase, task: Task, pooling: Pooling | None, max_length: int) -> npt.NDArray[Any]:
    pool = load_stage("pool")
    rows = []
    for text in embedding_texts(EMBED_SAMPLES, seed=7):
        encoded = tokenizer(text, truncation=True, max_length=max_length, return_tensors="np")
        out = run(encoded)
        if task is Task.SPLADE:
            rows.append(out[contract.SPLADE_WEIGHTS][0])
        elif task is Task.CLASSIFY:
            rows.append(pool.activate(out[contract.LOGITS], "softmax")[0])
        else:
            mode = (pooling or Pooling.CLS).value
            rows.append(pool.pool_tokens(out[contract.LAST_HIDDEN_STATE], encoded[contract.ATTENTION_MASK], mode)[0])
    return np.stack(rows)


def _rerank_scores(run: GraphRunner, tokenizer: PreTrainedTokenizerBase, max_length: int) -> list[npt.NDArray[Any]]:
    scores = []
    for case in rerank_cases(RERANK_QUERIES, RERANK_PASSAGES, seed=7):
        row = []
        for passage in case.passages:
            encoded = tokenizer(case.query, passage, truncation="only_second", max_length=max_length, return_tensors="np")
            row.append(float(run(encoded)[contract.LOGITS][0, 0]))
        scores.append(np.asarray(row))
    return scores


def agreement(fp32: GraphRunner, int8: GraphRunner, tokenizer: PreTrainedTokenizerBase, task: Task, pooling: Pooling | None,
              max_length: int) -> dict[str, float]:
    if task is Task.RERANK:
        want_scores = _rerank_scores(fp32, tokenizer, max_length)
        got_scores = _rerank_scores(int8, tokenizer, max_length)
        taus = [_kendall_tau(w, g) for w, g in zip(want_scores, got_scores)]
        top1 = [int(np.argmax(w) == np.argmax(g)) for w, g in zip(want_scores, got_scores)]
        return {"kendall_tau_mean": float(np.mean(taus)), "kendall_tau_min": float(np.min(taus)),
                "top1_agreement": float(np.mean(top1))}
    want = _vectors(fp32, tokenizer, task, pooling, max_length)
    got = _vectors(int8, tokenizer, task, pooling, max_length)
    cosines = _cosine(want, got)
    figures = {"cosine_mean": float(cosines.mean()), "cosine_min": float(cosines.min())}
    if task is Task.CLASSIFY:
        figures["label_agreement"] = float((want.argmax(-1) == got.argmax(-1)).mean())
    return figures


def quantize_with_report(fp32: Path, int8: Path, inputs: list[str], tokenizer: PreTrainedTokenizerBase, task: Task,
                         pooling: Pooling | None, max_length: int) -> QuantizeReport:
    """Write the better of per-tensor / per-channel int8 graphs to `int8`, with both figures."""
    reference = GraphRunner(fp32, inputs)
    figures, headline = {}, {}
    for per_channel in (False, True):
        candidate = int8.with_name(f"{int8.stem}.{'channel' if per_channel else 'tensor'}{int8.suffix}")
        quantize_dynamic_int8(fp32, candidate, per_channel)
        label = "per-channel" if per_channel else "per-tensor"
        figures[label] = agreement(reference, GraphRunner(candidate, inputs), tokenizer, task, pooling, max_length)
        headline[per_channel] = next(iter(figures[label].values()))
    keep = headline[True] > headline[False]
    for per_channel in (False, True):
        candidate = int8.with_name(f"{int8.stem}.{'channel' if per_channel else 'tensor'}{int8.suffix}")
        if per_channel == keep:
            candidate.replace(int8)
        else:
            candidate.unlink()
    return QuantizeReport(keep, figures)
