"""Export decisions that protect users: no random heads, the right pooling, the CLI's errors."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from prensa.cli import app
from prensa.export.inspect import plan_model
from prensa.export.source import SourceError, SourceModel
from prensa.manifest import Pooling, Task
from tests.tiny_models import tiny_bge_m3


@pytest.fixture(scope="module")
def m3_without_colbert(tmp_path_factory):
    return tiny_bge_m3(tmp_path_factory.mktemp("bge-m3-no-colbert"), with_heads=("sparse_linear.pt",))


def test_export_refuses_bge_m3_without_head_file(m3_without_colbert, tmp_path):
    result = CliRunner().invoke(app, ["export", str(m3_without_colbert), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "colbert_linear.pt is missing" in output and "--dense-only" in output
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_dense_only_serves_cls_normalised(m3_without_colbert):
    source = SourceModel(m3_without_colbert, "bge-m3", "x")
    plan = plan_model(source, ["XLMRobertaModel"], None, None, None, True, 512, 512, labels=1)
    assert (plan.task, plan.pooling, plan.normalize) == (Task.EMBED, Pooling.CLS, True)


def test_pooling_comes_from_sentence_transformers_config(minilm_dir, tmp_path):
    copy = shutil.copytree(minilm_dir, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    source = SourceModel(copy, "m", "x")
    assert plan_model(source, ["BertModel"], None, None, None, False, 512, 512, labels=1).pooling is Pooling.MEAN
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    plan = plan_model(source, ["BertModel"], None, None, None, False, 512, 512, labels=1)
    assert (plan.pooling, plan.max_length) == (Pooling.CLS, 256)
    assert plan_model(source, ["BertModel"], None, Pooling.LAST, 64, False, 512, 512, labels=1).pooling is Pooling.LAST


def test_unknown_hub_id_offline_gives_advice(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["export", "nobody/no-such-model", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "pass the local directory" in " ".join(result.output.split())


def test_missing_directory_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(SourceError, match="not a directory"):
        from prensa.export.source import resolve_source

        resolve_source(str(tmp_path / "missing"))


@pytest.mark.parametrize("config, message", [
    ({"prompts": {"query": 3}}, "must map names to texts"),
    ({"prompts": ["query: "]}, "must map names to texts"),
    ({"prompts": {"query": "query: "}, "default_prompt_name": "passage"}, "is not one of its prompts"),
])
def test_prompts_sentence_transformers_would_refuse_are_refused(tmp_path, config, message):
    from prensa.export.pipeline import ST_CONFIG, read_prompts

    (tmp_path / ST_CONFIG).write_text(json.dumps(config))
    with pytest.raises(SourceError, match=message):
        read_prompts(SourceModel(tmp_path, "m", "x"))


def test_prompts_default_to_none(minilm_dir, tmp_path):
    from prensa.export.pipeline import ST_CONFIG, read_prompts

    assert read_prompts(SourceModel(minilm_dir, "m", "x")) == ({}, None)  # its file has no prompts
    assert read_prompts(SourceModel(tmp_path, "m", "x")) == ({}, None)  # no file at all
    (tmp_path / ST_CONFIG).write_text(json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    assert read_prompts(SourceModel(tmp_path, "m", "x")) == ({"query": "query: "}, "query")
