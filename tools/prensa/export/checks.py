"""What the graph phase and the steps after it check a graph with: the verification texts as the
stages feed them, the graph run on torch and on onnxruntime, and the figures that compare them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from prensa.export import llm_reranker
from prensa.export.formats import calibration
from prensa.export.inspect import ModelPlan
from prensa.export.run import VerifyReport
from prensa.layouts import Layout
from prensa.manifest import GraphOutput
from prensa.stages import contract, load_stage

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

# Texts of different lengths, so verification covers padding inside a batch.
VERIFY_TEXTS = [
    "What is the capital of Germany?",
    "Berlin is the capital and largest city of Germany, with about 3.9 million inhabitants.",
    "ok",
    "Dense retrieval encodes queries and passages into vectors and ranks passages by similarity; "
    "sparse retrieval weights individual terms; late interaction keeps one vector per token.",
]
FP32_TOLERANCE = 1e-3


def sample_batch(
    tokenizer: PreTrainedTokenizerBase,
    kind: Layout,
    max_length: int,
    template: dict[str, str] | None = None,
    prompt: str | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """The verification texts as the stages feed the encoder: padded on the right, whatever side the
    tokenizer pads by itself; an LLM reranker's pairs written into its prompt; `prompt` before each
    text, its tokens marked as the gateway marks a prompt that the pooling leaves out."""
    if template is not None:
        return llm_reranker.sample_rows(
            tokenizer, template, [VERIFY_TEXTS[0]] * 3, VERIFY_TEXTS[1:], max_length
        )
    if kind.pair_input is not None:  # a cross-encoder's or classifier's pairs
        queries, passages = [VERIFY_TEXTS[0]] * 3, VERIFY_TEXTS[1:]
        encoded = tokenizer(
            queries,
            passages,
            padding=True,
            truncation=True,  # longest_first: short pairs here, cut by no rule
            max_length=max_length,
            return_tensors="np",
            padding_side="right",
        )
    else:
        texts = [(prompt or "") + text for text in VERIFY_TEXTS]
        encoded = tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="np",
            padding_side="right",
        )
    sample = {k: v.astype(np.int64) for k, v in encoded.items()}
    if kind.token_vectors:  # a late model's query expansion token: read, attended to by none
        mask = sample[contract.ATTENTION_MASK]
        mask[0, int(np.count_nonzero(mask[0])) - 1] = contract.UNATTENDED_TOKEN
    if prompt:
        skipped = load_stage("tokenize").prompt_length(tokenizer.backend_tokenizer, prompt)
        sample[contract.ATTENTION_MASK] = contract.mark_prompts(
            sample[contract.ATTENTION_MASK], [skipped] * len(texts)
        )
    return sample


def run_torch(
    graph: nn.Module, inputs: list[str], sample: dict[str, npt.NDArray[Any]]
) -> list[npt.NDArray[Any]]:
    """Reference outputs, a decoder's with transformers' own masks (the trace gets masks built for
    it); taken before tracing, which can leave the torch module altered."""
    import torch

    from prensa.export.graphs import transformers_masks

    with torch.no_grad(), transformers_masks(graph):
        expected = graph(*(torch.from_numpy(sample[n]) for n in inputs))
    return [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]


def run_onnx(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    provider: str = "CPUExecutionProvider",
) -> dict[str, npt.NDArray[Any]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=[provider])
    values = session.run(None, {n: sample[n] for n in inputs})
    return {meta.name: value for meta, value in zip(session.get_outputs(), values)}


def agreement_report(
    heading: str,
    actual: dict[str, npt.NDArray[Any]],
    expected: dict[str, npt.NDArray[Any]],
    mask: npt.NDArray[Any],
    outputs: list[GraphOutput],
    prefix: str = "",
) -> VerifyReport:
    """Cosine against fp32 per output; passes at MIN_COSINE or above."""
    from prensa.export.agreement import MIN_COSINE, agreement

    figures = agreement(actual, expected, mask, {o.name for o in outputs if o.per_token})
    return VerifyReport(
        f"{heading}, min cosine >= {MIN_COSINE}",
        {
            f"{prefix}{name}": f"min cosine {cos:.6f}, max |diff| {diff:.2e}"
            for name, (cos, diff) in figures.items()
        },
        all(cos >= MIN_COSINE for cos, _ in figures.values()),
    )


def check_fp16(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    outputs: list[GraphOutput],
) -> VerifyReport:
    """The fp16 graph against fp32 torch, on onnxruntime's CUDA provider when there is one, else its
    CPU provider; when neither runs the graph, the check is skipped and the report says why."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, Fail
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

    provider = (
        "CUDAExecutionProvider"
        if "CUDAExecutionProvider" in ort.get_available_providers()
        else "CPUExecutionProvider"
    )
    try:
        actual = run_onnx(path, inputs, sample, provider)
    except (EPFail, Fail, NoKernel) as exc:  # e.g. a provider without fp16 kernels for some op
        reason = str(exc).splitlines()[0]
        return VerifyReport(
            "fp16 accuracy check", {"skipped": f"{provider} cannot run this graph: {reason}"}, True
        )
    reference = {o.name: value for o, value in zip(outputs, expected)}
    return agreement_report(
        f"onnxruntime fp16 ({provider}) vs fp32 torch",
        actual,
        reference,
        sample[contract.ATTENTION_MASK],
        outputs,
    )


def compare_with_torch(
    actual: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    mask: npt.NDArray[Any],
    dtype: str,
) -> VerifyReport:
    figures, worst = {}, 0.0
    for (name, got), want in zip(actual.items(), expected):
        delta = np.abs(want - got)
        if delta.ndim >= 2 and delta.shape[:2] == mask.shape:
            delta = delta[mask.astype(bool)]  # padded positions are free to differ
        diff = float(delta.max()) if delta.size else 0.0
        figures[name], worst = f"max |onnx - torch| {diff:.2e}", max(worst, diff)
    ok = dtype != "fp32" or worst <= FP32_TOLERANCE
    return VerifyReport(
        f"onnxruntime vs torch ({'tolerance ' + str(FP32_TOLERANCE) if dtype == 'fp32' else dtype})",
        figures,
        ok,
    )


def check_adopted(
    actual: dict[str, npt.NDArray[Any]], outputs: list[GraphOutput], rows: int
) -> VerifyReport:
    figures, ok = {}, True
    for output in outputs:
        value = actual[output.name]
        good = value.shape[0] == rows and bool(np.isfinite(value).all())
        figures[output.name] = (
            f"shape {list(value.shape)}, {'finite' if good else 'NOT FINITE OR WRONG ROWS'}"
        )
        ok &= good
    return VerifyReport("adopted graph run on a sample batch", figures, ok)


def served_values(
    outputs: dict[str, npt.NDArray[Any]], sample: dict[str, npt.NDArray[Any]], plan: ModelPlan
) -> npt.NDArray[Any]:
    """What clients receive for the sample, from the graph's outputs through the pool stage: dense
    vectors, or SPLADE's vocabulary weights (the pool stage lists their non-zero ones)."""
    if contract.SPLADE_WEIGHTS in outputs:
        return outputs[contract.SPLADE_WEIGHTS]
    if contract.LOGITS in outputs:  # one-label scores: the pool stage's sigmoid
        return cast(
            npt.NDArray[Any], load_stage("pool").activate(outputs[contract.LOGITS], "sigmoid")
        )
    return calibration.served_dense(outputs, sample, plan.pooling, plan.normalize)


@dataclass(frozen=True)
class Reference:
    """What the model's own library answers for the sample, which the served values must equal."""

    name: str  # the report's line: sentence-transformers, or the model card
    values: npt.NDArray[Any]
    described: str  # what the served values are compared with, in the report


def check_reference(
    actual: dict[str, npt.NDArray[Any]],
    sample: dict[str, npt.NDArray[Any]],
    plan: ModelPlan,
    reference: Reference,
    report: VerifyReport,
) -> VerifyReport:
    """The served values against the reference: the check a layout read wrongly (a Dense layer
    skipped, the wrong pooling, padding or LM-head rows) cannot pass."""
    from prensa.export.agreement import (
        REFERENCE_MAX_DIFF,
        REFERENCE_MIN_COSINE,
        reference_agreement,
    )

    diff, cosine = reference_agreement(served_values(actual, sample, plan), reference.values)
    ok = diff <= REFERENCE_MAX_DIFF and cosine >= REFERENCE_MIN_COSINE
    figure = f"served vs {reference.described}: max |diff| {diff:.2e}, min cosine {cosine:.6f}" + (
        ""
        if ok
        else f" (needs <= {REFERENCE_MAX_DIFF:.0e} and >= {REFERENCE_MIN_COSINE}): prensa does not "
        f"serve this model as {reference.name} does"
    )
    return VerifyReport(
        report.heading, {**report.figures, reference.name: figure}, report.ok and ok
    )
