"""How an export reads sentence-transformers directories and newer architectures, and what it
refuses by name: every module served exactly or refused in one line, the check against `encode`
failing a layout read wrongly, causal LMs other than Qwen3-Reranker, remote code."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from prensa.cli import app
from prensa.export import sentence
from prensa.export.pipeline import ExportOptions, export_model
from prensa.export.source import SourceError, SourceModel
from prensa.export.st_layout import pooling_modes, read_layout
from prensa.layouts import static
from prensa.manifest import Manifest, Pooling, Task
from prensa.stages import load_stage
from prensa.triton.repo import ModelSource, ServingOptions, build_repository
from tests import tiny_layouts


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return tiny_layouts.dense_embedder(tmp_path_factory.mktemp("layouts") / "dense")


@pytest.fixture
def dense_copy(dense_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dense_dir, copy)
    return copy


def modules_of(directory):
    return json.loads((directory / "modules.json").read_text())


def source(directory) -> SourceModel:
    return SourceModel(directory, directory.name, "local")


@pytest.mark.parametrize(("config", "modes"), [
    ({"pooling_mode": "mean"}, ("mean",)),
    ({"pooling_mode": ["cls", "max"]}, ("cls", "max")),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, ("max", "mean")),  # legacy order
    ({"pooling_mode_cls_token": True}, ("cls",)),
    ({"pooling_mode_lasttoken": True}, ("lasttoken",)),
    ({"pooling_mode_weightedmean_tokens": True}, ("weightedmean",)),
    ({"pooling_mode_mean_sqrt_len_tokens": True}, ("mean_sqrt_len_tokens",)),
    ({"word_embedding_dimension": 8}, ("mean",)),  # no mode given: sentence-transformers' default
])
def test_pooling_configs_read_as_sentence_transformers_reads_them(config, modes):
    assert pooling_modes(config) == modes


def test_both_forms_of_a_directory_read_alike(dense_dir, tmp_path):
    legacy = tiny_layouts.as_legacy(shutil.copytree(dense_dir, tmp_path / "legacy"))
    assert modules_of(legacy)[1]["type"] == "sentence_transformers.models.Pooling"
    assert read_layout(source(legacy)) == read_layout(source(dense_dir))
    layout = read_layout(source(dense_dir))
    assert layout.pooling_modes == ("mean",) and layout.normalize and len(layout.dense) == 2
    assert [(d.bias, d.activation.rsplit(".", 1)[-1]) for d in layout.dense] == [(True, "Tanh"), (False, "Identity")]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda m: m.insert(2, {"idx": 9, "name": "9", "path": "9_CNN", "type": "sentence_transformers.models.CNN"}),
     "module 9_CNN of type sentence_transformers.models.CNN in modules.json is not served"),
    (lambda m: m.insert(1, m.pop()), "1_Pooling of type .*Pooling in modules.json comes in an order prensa does not"),
    (lambda m: m.__setitem__(0, {**m[0], "type": "sentence_transformers.models.StaticEmbedding"}),
     "StaticEmbedding in modules.json comes first where a Transformer must"),
    (lambda m: [m.pop(1) for _ in range(3)], "has no Pooling module"),  # Transformer -> Normalize
])
def test_a_module_prensa_does_not_serve_is_refused_by_name(dense_copy, mutate, message):
    modules = modules_of(dense_copy)
    mutate(modules)
    for idx, module in enumerate(modules):
        module["idx"] = idx
    (dense_copy / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(SourceError, match=message):
        read_layout(source(dense_copy))


def test_a_dense_activation_outside_torch_is_refused(dense_copy):
    config_path = dense_copy / "2_Dense" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "activation_function": "my_package.Swish"}))
    with pytest.raises(SourceError, match=r"2_Dense \(Dense\) uses activation my_package.Swish"):
        read_layout(source(dense_copy))


def test_a_prompt_left_out_of_the_pooling_is_checked_with_that_prompt(dense_copy, tmp_path, monkeypatch):
    """`include_prompt: false`: the export's check runs the model's prompt, marked as the gateway
    marks it, against `encode(prompt_name=...)`; left unmarked, the same export fails that check."""
    pooling_path = dense_copy / "1_Pooling" / "config.json"
    pooling_path.write_text(json.dumps({**json.loads(pooling_path.read_text()), "include_prompt": False}))
    config_path = dense_copy / "config_sentence_transformers.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "prompts": {"query": "query: "}}))
    manifest, report = export_model(ExportOptions(str(dense_copy), tmp_path / "out"))
    assert report.ok and not manifest.include_prompt, report.figures
    monkeypatch.setattr(load_stage("tokenize"), "prompt_length", lambda tokenizer, prompt: 0)
    _, unmarked = export_model(ExportOptions(str(dense_copy), tmp_path / "unmarked"))
    assert not unmarked.ok and "prensa does not serve this model" in unmarked.figures["sentence-transformers"]


@pytest.mark.parametrize("build", [tiny_layouts.wordpiece_tokenizer, tiny_layouts.gemma_tokenizer,
                                   lambda d: tiny_layouts.qwen_tokenizer(d, append_eos=True),
                                   lambda d: tiny_layouts.qwen_tokenizer(d, append_eos=False)])
@pytest.mark.parametrize("prompt", ["query: ", "Represent the query for retrieving passages: ",
                                    tiny_layouts.QWEN3_EMBEDDING_PROMPTS["query"], "task: search result | query: "])
def test_a_prompt_is_as_long_as_sentence_transformers_counts_it(tmp_path, build, prompt):
    from sentence_transformers.base.modules.transformer import Transformer
    from tokenizers import Tokenizer

    tokenizer = build(tmp_path)
    counting = SimpleNamespace(_prompt_length_mapping={}, tokenizer=tokenizer,  # all its prompt count reads
                               preprocess=lambda texts, **_: tokenizer(texts, return_tensors="pt"))
    want = Transformer._get_prompt_length(counting, prompt)
    assert load_stage("tokenize").prompt_length(Tokenizer.from_file(str(tmp_path / "tokenizer.json")), prompt) == want


def test_an_adopted_graph_cannot_leave_a_prompt_out(dense_copy, tmp_path):
    pooling_path = dense_copy / "1_Pooling" / "config.json"
    pooling_path.write_text(json.dumps({**json.loads(pooling_path.read_text()), "include_prompt": False,
                                        "pooling_mode": "mean"}))
    modules = [m for m in modules_of(dense_copy) if not m["type"].endswith("Dense")]
    (dense_copy / "modules.json").write_text(json.dumps(modules))
    export_model(ExportOptions(str(dense_copy), tmp_path / "first"))
    shutil.copy2(tmp_path / "first" / "model.onnx", dense_copy / "model.onnx")
    with pytest.raises(SourceError, match="include_prompt: false"):
        export_model(ExportOptions(str(dense_copy), tmp_path / "adopted"))


def test_the_graph_pools_dense_models_and_refuses_a_pooling_override(dense_dir, tmp_path):
    manifest, report = export_model(ExportOptions(str(dense_dir), tmp_path / "out"))
    assert report.ok and manifest.pooling is None and manifest.graph_pooling == "mean" and manifest.dim == 16
    assert {o.name for o in manifest.outputs} == {"last_hidden_state", "sentence_embedding"}
    with pytest.raises(SourceError, match="--pooling cannot replace them"):
        export_model(ExportOptions(str(dense_dir), tmp_path / "again", pooling=Pooling.CLS))
    with pytest.raises(ValueError, match="--pooling cannot change it"):
        build_repository([ModelSource("d", tmp_path / "out", Manifest.read(tmp_path / "out"))], tmp_path / "repo",
                         ServingOptions(pooling=Pooling.MEAN))


def test_an_export_that_skips_a_dense_layer_fails_its_own_check(dense_dir, tmp_path, monkeypatch):
    """The check compares what prensa serves with sentence-transformers' encode: a graph built
    without the Dense layers (the failure this check exists for) cannot pass it."""
    build = sentence.sentence_graph

    def without_dense(model, layout):
        from sentence_transformers import SentenceTransformer

        return build(SentenceTransformer(modules=[model[0], model[1], model[-1]], device="cpu"), layout)

    monkeypatch.setattr(sentence, "sentence_graph", without_dense)
    _, report = export_model(ExportOptions(str(dense_dir), tmp_path / "out"))
    assert not report.ok
    assert "does not serve this model as sentence-transformers does" in report.figures["sentence-transformers"]
    result = CliRunner().invoke(app, ["export", str(dense_dir), "--out", str(tmp_path / "cli")], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "the exported graph failed its check" in result.output


def test_a_causal_lm_that_is_not_qwen3_reranker_is_refused_by_name(tmp_path):
    from transformers import LlamaForCausalLM

    tokenizer = tiny_layouts.qwen_tokenizer(tmp_path / "llama", append_eos=False)
    config = tiny_layouts.decoder_config("llama", len(tokenizer), architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    with pytest.raises(SourceError, match=r"causal LM .*LlamaForCausalLM.* pass --task embed"):
        export_model(ExportOptions(str(tmp_path / "llama"), tmp_path / "out"))
    manifest, report = export_model(ExportOptions(str(tmp_path / "llama"), tmp_path / "out", task=Task.EMBED))
    assert report.ok and manifest.pooling is Pooling.LAST  # a decoder pools its last token


@pytest.mark.parametrize(("task", "head"), [(Task.RERANK, "classification head"), (Task.CLASSIFY, "classification head"),
                                          (Task.SPLADE, "masked-LM head")])
def test_a_task_whose_head_the_weights_lack_is_refused_by_name(tmp_path, task, head):
    """A bare encoder asked for as a reranker, classifier or SPLADE model: transformers would make up
    the head's weights at random, and the export would serve noise that matched its own check."""
    bare = tiny_layouts.bert_base(tmp_path / "bare", seed=3)
    with pytest.raises(SourceError, match=rf"no {head} in its weights \(missing .*\): transformers would initialise"):
        export_model(ExportOptions(str(bare), tmp_path / "out", task=task))
    masked = tiny_layouts.bert_base(tmp_path / "masked", seed=3, masked_lm=True)
    if task is Task.SPLADE:  # a masked LM has its head: served
        manifest, report = export_model(ExportOptions(str(masked), tmp_path / "splade", task=task))
        assert report.ok and manifest.task is Task.SPLADE


def test_remote_code_is_refused_by_name(dense_copy, tmp_path):
    config_path = dense_copy / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "model_type": "nomic_bert",
                                       "auto_map": {"AutoModel": "modeling_hf_nomic_bert.NomicBertModel"}}))
    with pytest.raises(SourceError, match=r"needs its own Python code .*auto_map.*never runs a model.s code"):
        export_model(ExportOptions(str(dense_copy), tmp_path / "out"))


def test_an_adopted_graph_cannot_skip_its_dense_layers(dense_copy, exports, tmp_path):
    shutil.copy2(exports["minilm"] / "model.onnx", dense_copy / "model.onnx")
    with pytest.raises(SourceError, match=r"Dense.*would be skipped"):
        export_model(ExportOptions(str(dense_copy), tmp_path / "out"))


def test_splade_saved_by_sparse_encoder_is_splade_not_an_embedder(tmp_path):
    directory = tiny_layouts.sparse_encoder(tmp_path / "splade", strategy="sum", activation="log1p_relu")
    layout = read_layout(source(directory))
    assert layout.is_splade and (layout.splade_strategy, layout.splade_activation) == ("sum", "log1p_relu")
    manifest, report = export_model(ExportOptions(str(directory), tmp_path / "out"))
    assert manifest.task is Task.SPLADE and report.ok, report.figures
    config_path = directory / modules_of(directory)[1]["path"] / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "pooling_strategy": "mean"}))
    with pytest.raises(SourceError, match="pooling_strategy 'mean'"):
        read_layout(source(directory))


def test_a_model_too_large_for_the_machine_is_refused_before_any_work(dense_dir, tmp_path):
    from prensa.export.inspect import EXPORT_PEAK_FACTOR, export_peak_bytes, require_memory

    weights = sum(path.stat().st_size for path in dense_dir.rglob("model.safetensors"))  # the Dense layers' too
    assert (dense_dir / "2_Dense" / "model.safetensors").exists()
    assert export_peak_bytes(source(dense_dir), {}) == int(weights * EXPORT_PEAK_FACTOR)
    assert export_peak_bytes(source(dense_dir), {"torch_dtype": "bfloat16"}) == int(weights * 2 * EXPORT_PEAK_FACTOR)
    require_memory(source(dense_dir), {}, available=2**40)
    with pytest.raises(SourceError, match=r"takes about \d+ GiB of memory .* this machine has 0 GiB free"):
        require_memory(source(dense_dir), {}, available=1024)


@pytest.mark.parametrize(("config", "st_config", "declared"), [
    ({"matryoshka_dimensions": [768, 64, 256, 64]}, {}, [64, 256, 768]),
    ({}, {"matryoshka_dimensions": [128]}, [128]),
    ({}, {"truncate_dim": 256}, []),  # trained to be cut, no list of where: any size
    ({}, {}, None),
])
def test_matryoshka_dimensions_are_read_where_models_declare_them(tmp_path, config, st_config, declared):
    from prensa.export.pipeline import read_matryoshka

    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    assert read_matryoshka(source(tmp_path), config) == declared


def test_a_matryoshka_list_of_anything_but_sizes_is_refused(tmp_path):
    from prensa.export.pipeline import read_matryoshka

    with pytest.raises(SourceError, match="matryoshka_dimensions must list positive sizes"):
        read_matryoshka(source(tmp_path), {"matryoshka_dimensions": [64, "all"]})


@pytest.fixture(scope="module")
def static_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    return {"root": tiny_layouts.static_embedder(root / "root"),
            "legacy": tiny_layouts.static_embedder(root / "legacy", normalize=True, cut=8, legacy=True),
            "model2vec": tiny_layouts.model2vec_embedder(root / "model2vec")}


def test_a_static_embedding_is_read_where_each_version_saves_it(static_dirs):
    root, legacy = (static.read_static(source(static_dirs[form])) for form in ("root", "legacy"))
    assert (root.folder, root.normalize, root.max_length) == (static_dirs["root"], False, None)
    assert (legacy.folder, legacy.normalize, legacy.max_length) == (
        static_dirs["legacy"] / "0_StaticEmbedding", True, 8)
    assert static.read_static(source(tiny_layouts.dense_embedder(static_dirs["root"].parent / "dense"))) is None


def test_a_model2vec_model_is_read_as_model2vec_reads_it_with_or_without_modules_json(static_dirs, tmp_path):
    """Its `embeddings` table (which sentence-transformers would read without the weights and the
    mapping) makes it model2vec's, and so does `model_type` in a directory of model2vec's files alone."""
    read = static.read_static(source(static_dirs["model2vec"]))
    assert (read.library, read.normalize, read.max_length) == (static.MODEL2VEC, True, static.MODEL2VEC_MAX_LENGTH)
    bare = shutil.copytree(static_dirs["model2vec"], tmp_path / "bare")
    (bare / "modules.json").unlink()
    assert static.read_static(source(bare)) is None  # nothing says what it is
    config = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "model_type": "model2vec", "normalize": False}))
    assert (static.read_static(source(bare)).library, static.read_static(source(bare)).normalize) == (
        static.MODEL2VEC, False)
    manifest, report = export_model(ExportOptions(str(bare), tmp_path / "out"))  # transformers knows no model2vec
    assert report.ok and "model2vec" in report.figures and not manifest.normalize, report.figures


def test_a_static_export_reads_texts_without_special_tokens_and_pools_in_its_graph(static_dirs, tmp_path):
    manifest, report = export_model(ExportOptions(str(static_dirs["legacy"]), tmp_path / "out"))
    assert report.ok, report.figures
    assert (manifest.task, manifest.graph_pooling, manifest.max_length, manifest.normalize) == (
        Task.EMBED, "mean", 8, True)
    assert manifest.inputs == ["input_ids", "attention_mask"]
    written = Tokenizer.from_file(str(tmp_path / "out" / manifest.tokenizer_file))
    own = Tokenizer.from_file(str(static_dirs["legacy"] / "0_StaticEmbedding" / "tokenizer.json"))
    text = "Berlin is the capital of Germany."
    assert written.encode(text).ids == own.encode(text, add_special_tokens=False).ids  # as StaticEmbedding reads it
    assert written.encode(text).ids != own.encode(text).ids  # the file itself frames a text with [CLS] and [SEP]


@pytest.mark.parametrize(("after", "options", "message"), [
    ("Dense", {}, "follows its StaticEmbedding with Dense"),
    (None, {"task": Task.RERANK}, "drop --task and --pooling"),
    (None, {"pooling": Pooling.CLS}, "drop --task and --pooling"),
])
def test_what_a_static_model_cannot_be_is_refused_by_name(static_dirs, tmp_path, after, options, message):
    copy = shutil.copytree(static_dirs["root"], tmp_path / "copy")
    if after is not None:
        entries = modules_of(copy)
        entries.append({"idx": 1, "name": "1", "path": "1_Dense", "type": f"sentence_transformers.models.{after}"})
        (copy / "modules.json").write_text(json.dumps(entries))
    with pytest.raises(SourceError, match=message):
        export_model(ExportOptions(str(copy), tmp_path / "out", **options))
