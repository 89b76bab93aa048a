"""Prompts and int8 embedding ranges, from a sentence-transformers model directory through the export
into the rendered repository, where the gateway reads them: the `prompts` parameter of the model
clients call, and `calibration.json` beside the served tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from prensa.export.formats.calibration import CORPUS, CORPUS_TEXTS, FIGURE, calibration_texts
from prensa.export.pipeline import ST_CONFIG, ExportOptions, export_model
from prensa.manifest import (
    CALIBRATION_FILE,
    MANIFEST_FILE,
    Manifest,
    Pooling,
    Task,
    read_dense_ranges,
)
from prensa.triton.config import config_parameters, parse_pbtxt
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, build_repository

# Quotes, a backslash, a newline and non-ASCII text: what the pbtxt and JSON layers must escape.
PROMPTS = {"query": "query: ", "passage": "passage: ",
           "quoted": 'Represent "this" sentence \\ for retrieval:\n', "german": "Für die Suche: "}
ADOPTED_PROMPTS = {"q": "search_query: "}


def _prompted_copy(source: Path, target: Path, prompts: dict[str, str], default: str | None) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / ST_CONFIG).read_text()) if (target / ST_CONFIG).exists() else {}
    (target / ST_CONFIG).write_text(json.dumps({**config, "prompts": prompts, "default_prompt_name": default}))
    return target


@pytest.fixture(scope="module")
def prompted(tmp_path_factory, minilm_dir) -> tuple[Path, Manifest, dict[str, str]]:
    """MiniLM with prompts, exported from torch."""
    root = tmp_path_factory.mktemp("prompted")
    source = _prompted_copy(minilm_dir, root / "source", PROMPTS, "query")
    manifest, report = export_model(ExportOptions(str(source), root / "export", task=Task.EMBED))
    assert report.ok
    return root / "export", manifest, report.figures


@pytest.fixture(scope="module")
def st_ranges(minilm_dir) -> np.ndarray:
    """The oracle: sentence-transformers' own vectors of the corpus, truncated at the same length."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    assert model.max_seq_length == 256
    vectors = model.encode(calibration_texts(), batch_size=32, convert_to_numpy=True)
    return np.vstack((vectors.min(0), vectors.max(0)))


def test_export_keeps_the_prompts_and_their_file(prompted):
    out, manifest, _ = prompted
    assert manifest.prompts == PROMPTS and manifest.default_prompt_name == "query"
    again = Manifest.read(out)
    assert again.prompts == PROMPTS and again.default_prompt_name == "query"
    assert json.loads((out / ST_CONFIG).read_text())["prompts"] == PROMPTS


def test_adopted_onnx_directories_get_prompts_and_calibration(prompted, tmp_path):
    out, _manifest, _ = prompted
    source = _prompted_copy(out, tmp_path / "onnx", ADOPTED_PROMPTS, None)
    (source / MANIFEST_FILE).unlink()
    (source / CALIBRATION_FILE).unlink()
    adopted, report = export_model(ExportOptions(str(source), tmp_path / "adopted", task=Task.EMBED))
    assert report.ok and adopted.prompts == ADOPTED_PROMPTS and adopted.default_prompt_name is None
    assert adopted.calibration_file == CALIBRATION_FILE
    np.testing.assert_allclose(read_dense_ranges(tmp_path / "adopted"),
                               read_dense_ranges(out), atol=1e-6)


@pytest.mark.parametrize("pipeline", list(Pipeline))
def test_client_facing_config_carries_prompts_as_json(prompted, tmp_path, pipeline):
    out, manifest, _ = prompted
    build_repository([ModelSource("e5", out, manifest)], tmp_path, ServingOptions(pipeline=pipeline))
    text = (tmp_path / "e5" / "config.pbtxt").read_text()
    assert '{\\"german\\": ' in text  # the JSON's quotes escaped inside the pbtxt string
    parameters = config_parameters(parse_pbtxt(text))
    assert json.loads(parameters["prompts"]) == PROMPTS
    assert parameters["prompts"] == json.dumps(PROMPTS, sort_keys=True)
    assert parameters["default_prompt_name"] == "query"
    if pipeline is Pipeline.ENSEMBLE:
        for stage in ("tokenize", "encode", "pool"):
            stage_config = parse_pbtxt((tmp_path / f"e5_{stage}" / "config.pbtxt").read_text())
            assert "prompts" not in config_parameters(stage_config)


def test_export_calibration_equals_sentence_transformers_ranges(prompted, st_ranges):
    out, manifest, figures = prompted
    assert manifest.calibration_file == CALIBRATION_FILE == Manifest.read(out).calibration_file
    data = json.loads((out / CALIBRATION_FILE).read_text())
    assert (data["texts"], data["corpus"]) == (CORPUS_TEXTS, CORPUS)
    assert CORPUS == "prensa.workload.embedding_texts(256, seed=0)"
    ranges = read_dense_ranges(out)
    assert ranges.shape == (2, manifest.dim) == (2, 384)
    assert (ranges[0] <= ranges[1]).all()
    np.testing.assert_allclose(ranges, st_ranges, atol=1e-4)
    assert figures[FIGURE].startswith("int8 embedding ranges: 256 texts")


@pytest.mark.parametrize("pipeline", list(Pipeline))
def test_calibration_lies_beside_the_served_tokenizer(prompted, tmp_path, pipeline):
    out, manifest, _ = prompted
    build_repository([ModelSource("e5", out, manifest)], tmp_path, ServingOptions(pipeline=pipeline))
    tokenizing = "e5" if pipeline is Pipeline.FUSED else "e5_tokenize"
    config = parse_pbtxt((tmp_path / tokenizing / "config.pbtxt").read_text())
    version = tmp_path / config.name / "1"
    assert (version / config_parameters(config)["tokenizer_file"]).exists()
    assert (version / CALIBRATION_FILE).read_bytes() == (out / CALIBRATION_FILE).read_bytes()
    assert len(list(tmp_path.rglob(CALIBRATION_FILE))) == 1


def test_a_pooling_override_drops_the_calibration(prompted, tmp_path):
    """Ranges of mean-pooled vectors do not describe CLS vectors; the gateway then has none."""
    out, manifest, _ = prompted
    build_repository([ModelSource("e5", out, manifest)], tmp_path, ServingOptions(pooling=Pooling.CLS))
    assert (tmp_path / "e5_tokenize" / "1" / "tokenizer.json").exists()
    assert not list(tmp_path.rglob(CALIBRATION_FILE))
    build_repository([ModelSource("e5", out, manifest)], tmp_path, ServingOptions(pooling=Pooling.MEAN))
    assert (tmp_path / "e5_tokenize" / "1" / CALIBRATION_FILE).exists()


def test_m3_calibration_is_cls_normalised(exports, m3_dir):
    """bge-m3's dense vector: CLS of the last hidden state, L2-normalised (FlagEmbedding's)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    manifest = Manifest.read(exports["bge-m3"])
    assert manifest.task is Task.M3 and manifest.calibration_file == CALIBRATION_FILE
    tokenizer, model = AutoTokenizer.from_pretrained(m3_dir), AutoModel.from_pretrained(m3_dir).eval()
    texts, rows = calibration_texts(), []
    for start in range(0, len(texts), 64):
        encoded = tokenizer(texts[start : start + 64], padding=True, truncation=True, max_length=256,
                            return_tensors="pt")
        with torch.no_grad():
            rows.append(torch.nn.functional.normalize(model(**encoded).last_hidden_state[:, 0], dim=-1).numpy())
    vectors = np.concatenate(rows)
    ranges = read_dense_ranges(exports["bge-m3"])
    assert ranges.shape == (2, manifest.dim)
    np.testing.assert_allclose(ranges, np.vstack((vectors.min(0), vectors.max(0))), atol=1e-4)


def test_int8_graphs_calibrate_one_row_per_pass(m3_dir, tmp_path):
    """As the encoder serves them: a dynamically quantised row's result depends on its neighbours."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "int8", quantize_int8=True))
    assert report.ok
    data = json.loads((tmp_path / "int8" / CALIBRATION_FILE).read_text())
    assert manifest.dtype == "int8" == data["dtype"] and data["rows_per_pass"] == 1
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "int8")
    session = ort.InferenceSession(str(tmp_path / "int8" / "model.onnx"), providers=["CPUExecutionProvider"])
    rows = []
    for text in calibration_texts():
        encoded = tokenizer(text, truncation=True, max_length=256, return_tensors="np")
        hidden = session.run(["last_hidden_state"], {n: encoded[n].astype(np.int64) for n in manifest.inputs})[0]
        rows.append(hidden[0, 0] / np.linalg.norm(hidden[0, 0]))
    vectors = np.stack(rows)
    np.testing.assert_allclose(read_dense_ranges(tmp_path / "int8"),
                               np.vstack((vectors.min(0), vectors.max(0))), atol=1e-5)


def test_fp16_graphs_calibrate_on_their_own_outputs(m3_dir, tmp_path, exports):
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "fp16", dtype="fp16"))
    assert manifest.dtype == "fp16"
    if manifest.calibration_file is None:  # a CPU provider without fp16 kernels: said, not hidden
        assert report.figures[FIGURE].startswith("skipped: CPUExecutionProvider cannot run")
        return
    assert json.loads((tmp_path / "fp16" / CALIBRATION_FILE).read_text())["dtype"] == "fp16"
    np.testing.assert_allclose(read_dense_ranges(tmp_path / "fp16"),
                               read_dense_ranges(exports["bge-m3"]), atol=1e-2)


def test_a_graph_the_cpu_cannot_run_is_exported_without_calibration(m3_dir, tmp_path, monkeypatch):
    from prensa.export.formats import calibration

    def unavailable(*_):
        raise calibration.CalibrationUnavailable("CPUExecutionProvider cannot run this graph: no fp16 kernel")

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / CALIBRATION_FILE).write_text("{}")  # a previous export's
    monkeypatch.setattr(calibration, "calibrate", unavailable)
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "out"))
    assert report.ok and manifest.calibration_file is None and Manifest.read(tmp_path / "out").calibration_file is None
    assert report.figures[FIGURE] == "skipped: CPUExecutionProvider cannot run this graph: no fp16 kernel"
    assert not (tmp_path / "out" / CALIBRATION_FILE).exists()


@pytest.mark.parametrize("name", ["reranker", "classifier", "msmarco", "splade"])
def test_tasks_without_dense_vectors_get_no_calibration(exports, name, tmp_path):
    manifest = Manifest.read(exports[name])
    assert manifest.calibration_file is None and not (exports[name] / CALIBRATION_FILE).exists()
    build_repository([ModelSource(name, exports[name], manifest)], tmp_path, ServingOptions())
    assert not list(tmp_path.rglob(CALIBRATION_FILE))
    assert "prompts" not in config_parameters(parse_pbtxt((tmp_path / name / "config.pbtxt").read_text()))


def test_manifests_without_the_new_fields_still_read(prompted, tmp_path):
    out, _, _ = prompted
    data = json.loads((out / MANIFEST_FILE).read_text())
    for key in ("prompts", "default_prompt_name", "calibration_file"):
        del data[key]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    manifest = Manifest.read(tmp_path)
    assert (manifest.prompts, manifest.default_prompt_name, manifest.calibration_file) == ({}, None, None)
