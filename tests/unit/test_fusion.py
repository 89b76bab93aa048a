"""Transformer op fusion at export: the fused graph computes what the traced one does, and one that
does not agree with torch is never kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from transformers import AutoTokenizer

from prensa.export.checks import run_onnx
from prensa.export.formats import fusion
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest

ORT_DOMAIN = "com.microsoft"
TEXTS = ["ok", "Where is the nearest train station?",
         "Late interaction keeps one vector per token and scores a query against every passage token; "
         "dense retrieval pools them into one vector, which is cheaper to store and to search."]


def ort_only_ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node
            if node.domain == ORT_DOMAIN}


@pytest.mark.parametrize("name", ["minilm", "bge-m3", "reranker"])
def test_fused_graph_matches_the_traced_one_on_a_padded_batch(name, exports, unfused_exports):
    fused, plain = Manifest.read(exports[name]), Manifest.read(unfused_exports[name])
    assert fused.fused_ops.get("Attention") and not plain.fused_ops
    assert "Attention" in ort_only_ops(exports[name] / "model.onnx")
    assert not ort_only_ops(unfused_exports[name] / "model.onnx")
    tokenizer = AutoTokenizer.from_pretrained(exports[name])
    batch = {k: v.astype(np.int64) for k, v in tokenizer(TEXTS, padding=True, return_tensors="np").items()}
    got = run_onnx(exports[name] / "model.onnx", fused.inputs, batch)
    want = run_onnx(unfused_exports[name] / "model.onnx", plain.inputs, batch)
    mask = batch["attention_mask"].astype(bool)
    for output, value in want.items():
        delta = np.abs(got[output] - value)
        if delta.ndim >= 2 and delta.shape[:2] == mask.shape:
            delta = delta[mask]  # padded positions are free to differ
        assert delta.max() < 1e-4, output


def test_a_fused_graph_that_disagrees_with_torch_is_not_kept(tmp_path, m3_dir, monkeypatch):
    fuse = fusion.fuse_transformer_ops

    def fuse_wrongly(graph, target, *args, **kwargs):
        fused = fuse(graph, target, *args, **kwargs)
        model = onnx.load(str(target))
        weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
        weight = next(t for t in model.graph.initializer if t.name in weights)
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 2 + 0.1, weight.name))
        onnx.save(model, str(target))
        return fused

    monkeypatch.setattr(fusion, "fuse_transformer_ops", fuse_wrongly)
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "m3"))
    assert report.ok and manifest.fused_ops == {}
    assert report.figures["fused ops"].startswith("not kept")
    assert not ort_only_ops(tmp_path / "m3" / "model.onnx")
    assert sorted(p.name for p in (tmp_path / "m3").glob("*model.onnx")) == ["model.onnx"]
