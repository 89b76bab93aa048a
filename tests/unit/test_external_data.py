"""Graphs over 2 GB, forced on tiny models: torch's per-tensor weights gathered into one
`model.onnx.data`, fusion, fp16 and int8 on external data, and `repo build` carrying exactly the
files a graph names, or naming the one it lacks before writing anything."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from prensa.cli import app
from prensa.export.checks import run_onnx, sample_batch
from prensa.export.pipeline import ExportOptions, export_model
from prensa.files import GraphDataError, graph_data_files
from prensa.layouts import of_manifest
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests.external_data import export_files, traced_as_torch_writes_large_graphs

DATA = "model.onnx.data"


@pytest.fixture(scope="module")
def gathered(tmp_path_factory, m3_dir):
    """tiny bge-m3 traced into per-tensor files, as torch writes bge-m3 at its real size, and kept
    external as a graph over 2 GB is."""
    out = tmp_path_factory.mktemp("gathered") / "m3"
    with traced_as_torch_writes_large_graphs() as traces:
        manifest, report = export_model(ExportOptions(str(m3_dir), out, external_data=True))
    return out, manifest, report, traces


def test_per_tensor_weights_are_gathered_into_one_file_beside_the_graph(gathered):
    out, manifest, report, traces = gathered
    [left_by_torch] = traces
    assert len(left_by_torch) > 20 and any(name.startswith("onnx__MatMul") for name in left_by_torch)
    assert report.ok, report.figures
    assert graph_data_files(out / "model.onnx") == [DATA]
    assert export_files(out) == ["model.onnx", DATA]
    assert (out / DATA).stat().st_mode == (out / "model.onnx").stat().st_mode  # onnx writes it owner-only
    assert manifest.fused_ops.get("Attention"), report.figures["fused ops"]  # fused though its weights are external


def test_the_gathered_graph_computes_what_the_plain_export_does(gathered, exports):
    out, manifest, _, _ = gathered
    from transformers import AutoTokenizer

    sample = sample_batch(AutoTokenizer.from_pretrained(out), of_manifest(manifest), 64)
    got = run_onnx(out / "model.onnx", manifest.inputs, sample)
    want = run_onnx(exports["bge-m3"] / "model.onnx", manifest.inputs, sample)
    mask = sample["attention_mask"].astype(bool)
    for name, value in want.items():
        assert np.abs(got[name][mask] - value[mask]).max() < 1e-5, name


@pytest.mark.parametrize("variant", [{"dtype": "fp16"}, {"quantize_int8": True}], ids=["fp16", "int8"])
def test_fp16_and_int8_keep_one_data_file_when_asked(tmp_path, m3_dir, variant):
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "m3", external_data=True, **variant))
    assert report.ok, report.figures
    assert manifest.dtype == variant.get("dtype", "int8")
    packed = ["model.packed.onnx"] if manifest.dtype == "fp16" else []  # the fp16 graph is packed too
    assert manifest.packed_file == (packed[0] if packed else None)
    assert export_files(tmp_path / "m3") == ["model.onnx", DATA, *packed]
    for graph in ("model.onnx", *packed):  # the packed graph reads the same weights file, no copy
        assert graph_data_files(tmp_path / "m3" / graph) == [DATA]
    assert (tmp_path / "m3" / DATA).stat().st_mode == (tmp_path / "m3" / "model.onnx").stat().st_mode


def test_a_graph_that_fits_stays_in_one_file(exports):
    assert graph_data_files(exports["bge-m3"] / "model.onnx") == []
    assert export_files(exports["bge-m3"]) == ["model.onnx"]


def test_repo_build_links_the_data_file_the_graph_names(gathered, tmp_path):
    out, manifest, _, _ = gathered
    build_repository([ModelSource("m3", out, manifest)], tmp_path / "repo", ServingOptions())
    version = tmp_path / "repo" / "m3_encode" / "1"
    assert sorted(p.name for p in version.iterdir() if p.name.startswith("model.onnx")) == ["model.onnx", DATA]
    assert (version / DATA).stat().st_ino == (out / DATA).stat().st_ino  # linked, not copied


@pytest.fixture
def broken(gathered, tmp_path):
    """A copy of the gathered export for a test to break."""
    copy = tmp_path / "broken"
    shutil.copytree(gathered[0], copy)
    return copy


def test_repo_build_names_a_missing_data_file_and_writes_nothing(broken, tmp_path):
    (broken / DATA).unlink()
    with pytest.raises(GraphDataError, match=f"weights file {DATA} is missing"):
        build_repository([ModelSource("m3", broken, Manifest.read(broken))], tmp_path / "repo", ServingOptions())
    assert not (tmp_path / "repo").exists()


def test_the_cli_refuses_it_in_one_line(broken, tmp_path):
    (broken / DATA).unlink()
    result = CliRunner().invoke(app, ["repo", "build", str(broken), "--name", "m3", "--repo", str(tmp_path / "repo")],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error:") and DATA in line and "missing" in line


def test_a_truncated_data_file_is_refused(broken):
    size = (broken / DATA).stat().st_size
    with (broken / DATA).open("r+b") as handle:
        handle.truncate(size - 4)
    with pytest.raises(GraphDataError, match=f"holds {size - 4} bytes, the graph reads up to byte {size}"):
        graph_data_files(broken / "model.onnx")


@pytest.mark.parametrize("location", ["../outside.data", "/etc/hostname"])
def test_a_data_file_outside_the_graphs_folder_is_refused(broken, location):
    model = onnx.load(str(broken / "model.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    next(entry for entry in tensor.external_data if entry.key == "location").value = location
    onnx.save(model, str(broken / "model.onnx"))
    with pytest.raises(GraphDataError, match="outside the graph's folder"):
        graph_data_files(broken / "model.onnx")
