"""fp16 graphs, TensorRT engines and the encode stage on a CUDA GPU, each against fp32 on the CPU
(the reference the export itself trusts). Skipped without a GPU (see conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prensa.export.agreement import agreement
from prensa.export.checks import VERIFY_TEXTS
from prensa.export.formats.packing import PACKED_FILE
from prensa.export.pipeline import ExportFormat
from prensa.manifest import Manifest
from prensa.stages import contract
from tests.gpu.conftest import CUDA

ROOT = Path(__file__).resolve().parents[2]
MIN_COSINE = 0.999  # fp16 against fp32, per real token and per pooled vector
STAGE_MIN_COSINE = {"fp32": 0.9999, "fp16": 0.999}  # the stage on CUDA against the same stage on the CPU
MODELS = ("minilm", "tiny-m3")


def token_batch(export: Path, rows: int = 8) -> dict[str, np.ndarray]:
    """`rows` texts of different lengths, padded to the longest, as the tokenize stage sends them."""
    from tokenizers import Tokenizer

    manifest = Manifest.read(export)
    tokenizer = Tokenizer.from_file(str(export / manifest.tokenizer_file))
    tokenizer.enable_truncation(manifest.max_length)
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch([VERIFY_TEXTS[i % len(VERIFY_TEXTS)] * (1 + i % 4) for i in range(rows)])
    return {contract.INPUT_IDS: np.array([e.ids for e in encodings], dtype=np.int64),
            contract.ATTENTION_MASK: np.array([e.attention_mask for e in encodings], dtype=np.int64),
            contract.TOKEN_TYPE_IDS: np.array([e.type_ids for e in encodings], dtype=np.int64)}


def run_graph(graph: Path, provider: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=[provider])
    assert session.get_providers()[0] == provider, f"{provider} did not load (CUDA or cuDNN libraries?)"
    names = {i.name for i in session.get_inputs()}
    values = session.run(None, {k: v for k, v in feed.items() if k in names})
    return {meta.name: value for meta, value in zip(session.get_outputs(), values)}


def assert_agrees(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], export: Path, mask: np.ndarray) -> None:
    per_token = {o.name for o in Manifest.read(export).outputs if o.per_token}
    figures = agreement(actual, expected, mask, per_token)
    assert set(figures) == set(expected)
    assert all(cos >= MIN_COSINE for cos, _ in figures.values()), figures


@pytest.mark.parametrize("model", MODELS)
def test_fp16_graph_on_cuda_agrees_with_fp32_on_cpu(gpu_export, model):
    fp32, _ = gpu_export(model, ExportFormat.ONNX, "fp32")
    fp16, report = gpu_export(model, ExportFormat.ONNX, "fp16")
    assert report.ok, report
    feed = token_batch(fp32)
    expected = run_graph(fp32 / "model.onnx", "CPUExecutionProvider", feed)
    assert_agrees(run_graph(fp16 / "model.onnx", CUDA, feed), expected, fp32, feed[contract.ATTENTION_MASK])


@pytest.mark.parametrize("model", [*MODELS, "tiny-reranker"])
def test_packed_graph_on_cuda_agrees_with_fp32_on_cpu(gpu_export, model):
    """The packed fp16 graph (padding removed inside the encoder) against the unpacked fp32 graph on
    the CPU: per real token cosine >= 0.999, reranker logits within 0.01."""
    fp32, _ = gpu_export(model, ExportFormat.ONNX, "fp32")
    fp16, report = gpu_export(model, ExportFormat.ONNX, "fp16")
    assert Manifest.read(fp16).packed_file == PACKED_FILE, report.figures
    feed = token_batch(fp32)
    expected = run_graph(fp32 / "model.onnx", "CPUExecutionProvider", feed)
    packed = run_graph(fp16 / PACKED_FILE, CUDA, feed)
    if "logits" in expected:
        assert np.abs(packed["logits"] - expected["logits"]).max() <= 1e-2
    else:
        assert_agrees(packed, expected, fp32, feed[contract.ATTENTION_MASK])


@pytest.mark.parametrize("model", MODELS)
def test_tensorrt_engine_agrees_with_fp32_graph(gpu_export, model):
    from prensa.export.formats.tensorrt import EngineRunner, missing_tensorrt

    if missing := missing_tensorrt():
        pytest.skip(f"needs {missing}")
    export, report = gpu_export(model, ExportFormat.TENSORRT, "fp16")
    assert report.ok, report
    assert Manifest.read(export).tensorrt is not None
    feed = token_batch(export)
    engine = EngineRunner(export / "model.plan")
    actual = engine.run({name: feed[name] for name in engine.inputs})
    expected = run_graph(export / "model.onnx", "CPUExecutionProvider", feed)
    assert_agrees(actual, expected, export, feed[contract.ATTENTION_MASK])


@pytest.mark.parametrize(("model", "dtype"), [("minilm", "fp32"), ("minilm", "fp16"), ("tiny-m3", "fp16")])
def test_encode_stage_on_cuda_agrees_with_the_cpu_stage(gpu_export, model, dtype):
    export, _ = gpu_export(model, ExportFormat.ONNX, dtype)
    done = subprocess.run([sys.executable, "-m", "tests.gpu.stage_check", str(export)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["torch_imported"]  # as in Triton's stub
    for policy in ("cuda", "cuda gpu-batching", *(["cuda as served"] if dtype == "fp16" else [])):
        assert report[policy]["provider"] == CUDA, report
        assert report[policy]["min_cosine"] >= STAGE_MIN_COSINE[dtype], report
    if dtype == "fp16":  # as a repository configures it: the packed graph and CUDA graphs both in use
        assert report["cuda as served"]["packed"] and report["cuda as served"]["cuda_graphs"] > 0, report
