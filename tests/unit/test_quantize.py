"""int8 export: both weight granularities measured against fp32, the closer one kept and served."""

from __future__ import annotations

from prensa.export.formats.onnx_graph import describe_graph
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest


def test_int8_export_reports_and_keeps_the_closer_variant(tmp_path, reranker_dir):
    manifest, report = export_model(ExportOptions(str(reranker_dir), tmp_path / "int8", quantize_int8=True))
    assert manifest.dtype == "int8" == Manifest.read(tmp_path / "int8").dtype
    assert describe_graph(tmp_path / "int8" / "model.onnx").dtype == "int8"
    rows = {k: v for k, v in report.figures.items() if k.startswith("int8")}
    assert len(rows) == 2 and sum("(kept)" in k for k in rows) == 1
    taus = {k: float(v.split("kendall_tau_mean ")[1].split(",")[0]) for k, v in rows.items()}
    kept = next(k for k in taus if "(kept)" in k)
    assert taus[kept] == max(taus.values()) and -1.0 <= taus[kept] <= 1.0
    assert sorted(p.name for p in (tmp_path / "int8").glob("*model*")) == ["model.onnx"]
    assert manifest.fused_ops.get("Attention")  # quantised from the fused fp32 graph
