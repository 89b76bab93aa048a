"""`prensa export`: model directory or Hub id -> ONNX graph + tokenizer + manifest, verified."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prensa.export.inspect import plan_model
from prensa.export.source import SourceError, resolve_source
from prensa.manifest import Manifest, Pooling, Task
from prensa.stages import contract

ONNX_FILE = "model.onnx"
OPSET = 17
# Texts of different lengths, so verification covers padding inside a batch.
VERIFY_TEXTS = [
    "What is the capital of Germany?",
    "Berlin is the capital and largest city of Germany, with about 3.9 million inhabitants.",
    "ok",
    "Dense retrieval encodes queries and passages into vectors and ranks passages by similarity; "
    "sparse retrieval weights individual terms; late interaction keeps one vector per token.",
]
FP32_TOLERANCE = 1e-3

Step = Callable[[str], AbstractContextManager]


@dataclass(frozen=True)
class ExportOptions:
    source: str
    out: Path
    task: Task | None = None
    pooling: Pooling | None = None
    max_length: int | None = None
    dtype: str = "fp32"
    dense_only: bool = False
    revision: str | None = None


@dataclass(frozen=True)
class VerifyReport:
    max_abs_diff: dict[str, float]
    tolerance: float | None

    @property
    def ok(self) -> bool:
        return self.tolerance is None or all(d <= self.tolerance for d in self.max_abs_diff.values())


def _no_progress(_: str) -> AbstractContextManager:
    return nullcontext()


def special_ids(tokenizer) -> list[int]:
    """Ids never reported as lexical terms (FlagEmbedding drops cls, eos, pad and unk)."""
    names = ("cls_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "pad_token_id", "unk_token_id")
    return sorted({getattr(tokenizer, n) for n in names if getattr(tokenizer, n, None) is not None})


def _sample_batch(tokenizer, task: Task, max_length: int) -> dict[str, np.ndarray]:
    if task in (Task.RERANK, Task.CLASSIFY):
        pairs = [(VERIFY_TEXTS[0], text) for text in VERIFY_TEXTS[1:]]
        encoded = tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation="only_second",
                            max_length=max_length, return_tensors="np")
    else:
        encoded = tokenizer(VERIFY_TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    return {k: v.astype(np.int64) for k, v in encoded.items()}


def _trace(graph, inputs: list[str], outputs, sample: dict[str, np.ndarray], path: Path) -> None:
    import torch

    args = tuple(torch.from_numpy(sample[name]) for name in inputs)
    axes = {name: {0: "batch", 1: "tokens"} for name in inputs}
    axes.update({o.name: ({0: "batch", 1: "tokens"} if o.per_token else {0: "batch"}) for o in outputs})
    with torch.no_grad():
        torch.onnx.export(graph, args, str(path), input_names=inputs, output_names=[o.name for o in outputs],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True)


def _to_fp16(path: Path) -> None:
    """fp16 weights and compute, fp32 inputs/outputs; LayerNorm and softmax stay fp32 (overflow)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(path))
    converted = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=["LayerNormalization", "Softmax", "Pow", "ReduceMean", "Sqrt"]
    )
    onnx.save(converted, str(path), save_as_external_data=converted.ByteSize() > 2_000_000_000)


def run_torch(graph, inputs: list[str], sample: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Reference outputs; taken before tracing, which can leave the torch module altered."""
    import torch

    with torch.no_grad():
        expected = graph(*(torch.from_numpy(sample[n]) for n in inputs))
    return [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]


def verify(onnx_path: Path, inputs: list[str], sample: dict[str, np.ndarray], expected: list[np.ndarray],
           dtype: str) -> VerifyReport:
    """Compare onnxruntime on the exported file with torch on the same inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    actual = session.run(None, {n: sample[n] for n in inputs})
    mask = sample[contract.ATTENTION_MASK].astype(bool)
    diffs = {}
    for meta, want, got in zip(session.get_outputs(), expected, actual):
        delta = np.abs(want - got)
        if delta.ndim >= 2 and delta.shape[:2] == mask.shape:
            delta = delta[mask]  # padded positions are free to differ
        diffs[meta.name] = float(delta.max()) if delta.size else 0.0
    return VerifyReport(diffs, FP32_TOLERANCE if dtype == "fp32" else None)


def export_model(options: ExportOptions, step: Step = _no_progress) -> tuple[Manifest, VerifyReport]:
    from transformers import AutoConfig, AutoTokenizer

    with step("Locating model files"):
        source = resolve_source(options.source, options.revision)
        config = AutoConfig.from_pretrained(source.path)
        tokenizer = AutoTokenizer.from_pretrained(source.path, use_fast=True)
        if not tokenizer.is_fast:
            raise SourceError(f"{source.name} has no fast (Rust) tokenizer; prensa's tokenize stage needs tokenizer.json")
        pad_offset = (config.pad_token_id or 0) + 1 if config.model_type in ("xlm-roberta", "roberta") else 0
        position_limit = getattr(config, "max_position_embeddings", None)
        plan = plan_model(
            source, list(config.architectures or []), options.task, options.pooling, options.max_length,
            options.dense_only, getattr(tokenizer, "model_max_length", None),
            position_limit - pad_offset if position_limit else None,
        )
    options.out.mkdir(parents=True, exist_ok=True)
    with step(f"Loading {plan.task.value} model"):
        from prensa.export.graphs import build_graph

        graph, outputs = build_graph(plan.task, source.path)
        inputs = [n for n in (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
                  if n in tokenizer.model_input_names]
        sample = _sample_batch(tokenizer, plan.task, plan.max_length)
        expected = run_torch(graph, inputs, sample)
    onnx_path = options.out / ONNX_FILE
    with step(f"Tracing to ONNX (opset {OPSET})"):
        _trace(graph, inputs, outputs, sample, onnx_path)
    if options.dtype == "fp16":
        with step("Converting to fp16 (LayerNorm and softmax kept in fp32)"):
            _to_fp16(onnx_path)
    with step("Verifying onnxruntime against torch"):
        report = verify(onnx_path, inputs, sample, expected, options.dtype)
    with step("Writing tokenizer and manifest"):
        tokenizer.save_pretrained(options.out)
        for extra in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
            if source.has(extra):
                (options.out / extra).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source.path / extra, options.out / extra)
        manifest = Manifest(
            task=plan.task,
            source=source.name,
            revision=source.revision,
            max_length=plan.max_length,
            onnx_file=ONNX_FILE,
            dtype=options.dtype,
            inputs=inputs,
            outputs=outputs,
            pad_id=int(tokenizer.pad_token_id or 0),
            special_ids=special_ids(tokenizer),
            pooling=plan.pooling,
            normalize=plan.normalize,
            dim=config.hidden_size if plan.task in (Task.EMBED, Task.M3) else None,
            id2label={int(k): v for k, v in (config.id2label or {}).items()} if plan.task is Task.CLASSIFY else {},
        )
        manifest.write(options.out)
    return manifest, report
