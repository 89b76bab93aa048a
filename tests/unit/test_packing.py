"""The packed graph (onnxruntime's packing mode) as an export writes it and a repository carries it,
and the encode stage's check that decides whether it serves. Its ops run on CUDA only: tests/gpu
runs it against the unpacked graph there."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from prensa.export.formats.packing import PACKED_FILE, packing_refusal
from prensa.export.pipeline import ExportOptions, export_model
from prensa.export.steps.pack import PACKED_FIGURE
from prensa.files import graph_data_files
from prensa.manifest import Manifest
from prensa.stages import contract, load_stage
from prensa.triton.repo import ModelSource, ServingOptions, build_repository

encode = load_stage("encode")


def ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.fixture(scope="module")
def fp16_m3(tmp_path_factory, m3_dir):
    out = tmp_path_factory.mktemp("packing") / "m3-fp16"
    manifest, report = export_model(ExportOptions(str(m3_dir), out, dtype="fp16"))
    return out, manifest, report


def test_an_fp16_export_writes_the_packed_graph_beside_its_own(fp16_m3):
    out, manifest, report = fp16_m3
    assert manifest.packed_file == PACKED_FILE and report.figures[PACKED_FIGURE].startswith(PACKED_FILE)
    packed, plain = ops(out / PACKED_FILE), ops(out / manifest.onnx_file)
    assert {"RemovePadding", "RestorePadding", "PackedAttention"} <= packed and "Attention" not in packed
    assert "Attention" in plain and "RemovePadding" not in plain
    # the same inputs and outputs: the stage feeds it what it feeds the unpacked graph
    for graph in (PACKED_FILE, manifest.onnx_file):
        model = onnx.load(str(out / graph), load_external_data=False)
        assert [i.name for i in model.graph.input] == manifest.inputs
        assert [o.name for o in model.graph.output] == [o.name for o in manifest.outputs]
    # one weights file, read by both graphs
    assert graph_data_files(out / PACKED_FILE) == graph_data_files(out / manifest.onnx_file) == ["model.onnx.data"]


@pytest.mark.parametrize(("options", "reason"), [
    ({}, None),  # fp32: not asked
    ({"dtype": "fp16", "fuse_ops": False}, "no fused ops"),
    ({"pack": True, "quantize_int8": True}, "int8"),
    ({"dtype": "fp16", "pack": False}, None),
])
def test_exports_without_a_packed_graph_say_why(tmp_path, m3_dir, options, reason):
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "m3", **options))
    assert manifest.packed_file is None and not (tmp_path / "m3" / PACKED_FILE).exists()
    if reason is None:
        assert PACKED_FIGURE not in report.figures
    else:
        assert reason in report.figures[PACKED_FIGURE]


def test_an_fp32_export_is_packed_when_asked(tmp_path, exports, m3_dir):
    manifest, _ = export_model(ExportOptions(str(m3_dir), tmp_path / "m3", pack=True))
    assert manifest.packed_file == PACKED_FILE and "PackedAttention" in ops(tmp_path / "m3" / PACKED_FILE)


def test_a_graph_without_fused_attention_is_refused_by_name(exports):
    model = onnx.load(str(exports["minilm"] / "model.onnx"), load_external_data=False)
    assert packing_refusal(model) is None  # fused: it can be tried
    unfused = onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], []))
    assert "no fused Attention" in packing_refusal(unfused)


def test_only_a_cuda_repository_carries_the_packed_graph(fp16_m3, tmp_path):
    out, manifest, _ = fp16_m3
    for provider in ("cuda", "cpu"):
        build_repository([ModelSource("m3", out, manifest)], tmp_path / provider,
                         ServingOptions(execution_provider=provider))
    cuda, cpu = tmp_path / "cuda" / "m3_encode", tmp_path / "cpu" / "m3_encode"
    assert (cuda / "1" / PACKED_FILE).is_file() and not (cpu / "1" / PACKED_FILE).exists()
    assert '"packed_onnx_file"' in (cuda / "config.pbtxt").read_text()
    assert "packed_onnx_file" not in (cpu / "config.pbtxt").read_text()
    # on CUDA the stage sees windows of rows large enough to plan passes over
    assert f"max_batch_size: {contract.GPU_WINDOW_ROWS}" in (cuda / "config.pbtxt").read_text()


class Shifted:
    """A session whose outputs are another's, shifted: what a packed graph that computes something
    else would give."""

    def __init__(self, session, shift: float) -> None:
        self.session, self.shift = session, shift

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, names, feed, options=None):
        return [value + self.shift * (1 + np.arange(value.shape[-1], dtype=value.dtype)) for value in
                self.session.run(names, feed)]


@pytest.mark.parametrize("model", ["bge-m3", "reranker"])
def test_the_stage_serves_a_packed_graph_only_if_it_agrees(exports, model):
    export = exports[model]
    manifest = Manifest.read(export)
    per_token = {o.name for o in manifest.outputs if o.per_token}
    session = encode.create_session(export / manifest.onnx_file, 1, "cpu")
    agree = encode.packed_refusal(session, session, manifest.pad_id, 64, per_token)
    assert agree is None
    differs = encode.packed_refusal(session, Shifted(session, 0.5), manifest.pad_id, 64, per_token)
    assert differs is not None and ("cosine" in differs or "differ by" in differs)


def test_the_container_serves_the_packed_graph_only_where_the_export_checked_it(fp16_m3, tmp_path):
    """Triton's onnxruntime backend cannot check a graph when it loads, as the Python stage does: it
    gets the packed graph only from an export that checked it on CUDA."""
    from dataclasses import replace

    from prensa.triton.repo import Target

    out, manifest, _ = fp16_m3
    for checked in (False, True):
        build_repository([ModelSource("m3", out, replace(manifest, packed_checked=checked))],
                         tmp_path / str(checked), ServingOptions(target=Target.CONTAINER))
        version = tmp_path / str(checked) / "m3_encode"
        config = (version / "config.pbtxt").read_text()
        served = PACKED_FILE if checked else manifest.onnx_file
        assert f'default_model_filename: "{served}"' in config
        assert (version / "1" / served).is_file()
