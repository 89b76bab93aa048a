"""Rendered repositories: every config parses with Triton's schema and carries the serving rules."""

from __future__ import annotations

import pytest

from prensa.manifest import Manifest
from prensa.triton.config import parse_pbtxt
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, Target, build_repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory, exports):
    root = tmp_path_factory.mktemp("repo")
    build_repository([ModelSource(n, p, Manifest.read(p)) for n, p in exports.items()], root,
                     ServingOptions(max_batch_size=16, max_queue_size=7, encode_instances=2))
    return root


def test_stage_configs_batch_bound_queue_and_warm_up(repo):
    for stage in ("tokenize", "encode", "pool"):
        config = parse_pbtxt((repo / f"bge-m3_{stage}" / "config.pbtxt").read_text())
        assert config.backend == "python" and config.max_batch_size == 16
        policy = config.dynamic_batching.default_queue_policy
        assert policy.max_queue_size == 7 and policy.timeout_action == policy.REJECT
        assert config.model_warmup and config.instance_group[0].count == (2 if stage == "encode" else 1)
        for _name, data in config.model_warmup[0].inputs.items():
            if data.input_data_file:
                assert (repo / f"bge-m3_{stage}" / "warmup" / data.input_data_file).stat().st_size > 0
    encode = parse_pbtxt((repo / "bge-m3_encode" / "config.pbtxt").read_text())
    assert all(i.allow_ragged_batch for i in encode.input)
    assert {o.name for o in encode.output} == {"last_hidden_state", "token_weights", "colbert_vecs"}


@pytest.mark.parametrize("pipeline", list(Pipeline))
def test_encoders_default_to_one_spinning_instance(tmp_path, exports, pipeline):
    """One instance owns the cores, so only a single one lets onnxruntime spin; the native container
    encoder also runs one."""
    source = ModelSource("m", exports["minilm"], Manifest.read(exports["minilm"]))
    encoder = tmp_path / ("m" if pipeline is Pipeline.FUSED else "m_encode") / "config.pbtxt"
    for instances, count, spinning in ((None, 1, "true"), (2, 2, "false"), (3, 3, "false")):
        chosen = {} if instances is None else {"encode_instances": instances}
        build_repository([source], tmp_path, ServingOptions(pipeline=pipeline, **chosen))
        config = parse_pbtxt(encoder.read_text())
        assert config.instance_group[0].count == count
        assert config.parameters["allow_spinning"].string_value == spinning
    build_repository([source], tmp_path / "container", ServingOptions(target=Target.CONTAINER))
    assert parse_pbtxt((tmp_path / "container" / "m_encode" / "config.pbtxt").read_text()).instance_group[0].count == 1


@pytest.mark.parametrize("target", list(Target))
def test_queues_have_no_policy_unless_bounded(tmp_path, exports, target):
    """Any default_queue_policy switches off the batcher's prefetching, which exposes Triton's 0.5 s
    lost wake-up (tests/e2e/test_queue_stall.py): by default no stage gets one."""
    source = ModelSource("m", exports["minilm"], Manifest.read(exports["minilm"]))
    build_repository([source], tmp_path, ServingOptions(target=target))
    configs = [parse_pbtxt(path.read_text()) for path in tmp_path.glob("*/config.pbtxt")]
    batching = [c for c in configs if c.HasField("dynamic_batching")]
    assert len(batching) >= 2
    assert not any(c.dynamic_batching.HasField("default_queue_policy") for c in batching)


def test_ensemble_outputs_and_parameters(repo):
    m3 = parse_pbtxt((repo / "bge-m3" / "config.pbtxt").read_text())
    assert m3.platform == "ensemble"
    assert [o.name for o in m3.output] == ["dense", "sparse_ids", "sparse_weights", "colbert", "num_tokens"]
    assert m3.parameters["task"].string_value == "m3"
    minilm = parse_pbtxt((repo / "minilm" / "config.pbtxt").read_text())
    assert [o.name for o in minilm.output] == ["dense", "num_tokens"]
    assert minilm.parameters["pooling"].string_value == "mean"
    pool = parse_pbtxt((repo / "minilm_pool" / "config.pbtxt").read_text())
    assert pool.parameters["pooling"].string_value == "mean"
    assert "prompts" not in minilm.parameters and "default_prompt_name" not in minilm.parameters  # it has none


def test_calibration_of_dense_models_lies_beside_their_tokenizer(repo, exports):
    from prensa.manifest import CALIBRATION_FILE, Task

    for name, export in exports.items():
        manifest = Manifest.read(export)
        version = repo / f"{name}_tokenize" / "1"
        assert (version / manifest.tokenizer_file).exists()
        assert (version / CALIBRATION_FILE).exists() == (manifest.task in (Task.EMBED, Task.M3)), name
    assert {"minilm", "bge-m3"} <= {p.parent.parent.name.removesuffix("_tokenize") for p in repo.rglob(CALIBRATION_FILE)}
    assert all(p.parent.parent.name.endswith("_tokenize") for p in repo.rglob(CALIBRATION_FILE))


def test_stage_code_is_copied_not_rewritten(repo):
    from prensa.stages import stage_model_file

    for stage in ("tokenize", "encode", "pool"):
        assert (repo / f"minilm_{stage}" / "1" / "model.py").read_text() == stage_model_file(stage).read_text()
        assert (repo / f"minilm_{stage}" / "1" / "prensa_stage.py").exists()


def test_budget_smaller_than_max_length_is_refused(tmp_path, exports):
    with pytest.raises(ValueError, match="max_batch_tokens"):
        build_repository([ModelSource("m", exports["minilm"], Manifest.read(exports["minilm"]))], tmp_path,
                         ServingOptions(max_batch_tokens=100))


def test_int8_graphs_encode_one_row_per_pass(tmp_path, exports):
    """Dynamic int8 quantisation scales activations per tensor: neighbours would change results."""
    build_repository([ModelSource("msmarco", exports["msmarco"], Manifest.read(exports["msmarco"]))], tmp_path,
                     ServingOptions(max_batch_size=32))
    config = parse_pbtxt((tmp_path / "msmarco_encode" / "config.pbtxt").read_text())
    assert config.parameters["max_rows"].string_value == "1" and config.max_batch_size == 32


def test_repo_build_cli_reads_a_models_file(tmp_path, exports):
    from typer.testing import CliRunner

    from prensa.cli import app

    listing = tmp_path / "models.toml"
    listing.write_text(f'[models]\nembedder = "{exports["minilm"]}"\nsparse = "{exports["splade"]}"\n')
    result = CliRunner().invoke(app, ["repo", "build", f"rr={exports['reranker']}", "--models", str(listing),
                                      "--repo", str(tmp_path / "repo"), "--max-batch-size", "8"])
    assert result.exit_code == 0, result.output
    for name in ("embedder", "sparse", "rr"):
        assert parse_pbtxt((tmp_path / "repo" / name / "config.pbtxt").read_text()).max_batch_size == 8


def test_fused_pipeline_renders_one_model_with_every_stage_and_replaces_the_ensemble(tmp_path, exports):
    source = ModelSource("rr", exports["reranker"], Manifest.read(exports["reranker"]))
    build_repository([source], tmp_path, ServingOptions())
    written = build_repository([source], tmp_path, ServingOptions(pipeline=Pipeline.FUSED, encode_instances=3))
    assert written == ["rr"] and sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["rr"]  # no stale stages
    config = parse_pbtxt((tmp_path / "rr" / "config.pbtxt").read_text())
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["pipeline"] == "fused" and params["task"] == "rerank" and params["activation"] == "sigmoid"
    assert {"tokenizer_file", "onnx_file", "max_batch_tokens", "pad_id", "drop_ids"} <= set(params)
    inputs = {i.name: i for i in config.input}
    assert set(inputs) == {"text", "text_pair", "input_ids", "attention_mask", "token_type_ids"}
    assert all(i.optional for i in inputs.values()) and inputs["input_ids"].allow_ragged_batch
    assert {o.name for o in config.output} == {"logits", "scores", "num_tokens"}
    assert config.instance_group[0].count == 3 and config.model_warmup[0].inputs["text_pair"].input_data_file
    assert params["allow_spinning"] == "false"
    build_repository([source], tmp_path, ServingOptions(pipeline=Pipeline.FUSED))
    assert parse_pbtxt((tmp_path / "rr" / "config.pbtxt").read_text()).instance_group[0].count == 1
    version = tmp_path / "rr" / "1"
    for module in ("model.py", "prensa_stage.py", "prensa_stage_tokenize.py", "prensa_stage_encode.py",
                   "prensa_stage_pool.py", params["tokenizer_file"], params["onnx_file"]):
        assert (version / module).is_file(), module


def test_fused_pipeline_needs_the_cpu_target(tmp_path, exports):
    with pytest.raises(ValueError, match="fused"):
        build_repository([ModelSource("m", exports["minilm"], Manifest.read(exports["minilm"]))], tmp_path,
                         ServingOptions(pipeline=Pipeline.FUSED, target=Target.CONTAINER))


def test_a_splade_encoder_passes_fewer_tokens_so_its_logits_stay_bounded(tmp_path, exports):
    """A SPLADE pass holds [tokens x vocabulary] logits: its budget keeps them near SPLADE_LOGITS_BYTES,
    never below one full-length text; other tasks keep the option's."""
    from prensa.triton.repo import SPLADE_LOGITS_BYTES, encoder_token_budget

    splade, minilm = Manifest.read(exports["splade"]), Manifest.read(exports["minilm"])
    vocab = next(o.dims[0] for o in splade.outputs if o.name == "splade_weights")
    expected = max(splade.max_length, SPLADE_LOGITS_BYTES // (4 * vocab))
    assert expected < ServingOptions().max_batch_tokens
    build_repository([ModelSource("s", exports["splade"], splade), ModelSource("m", exports["minilm"], minilm)],
                     tmp_path, ServingOptions())
    budgets = {name: int(parse_pbtxt((tmp_path / f"{name}_encode" / "config.pbtxt").read_text())
                         .parameters["max_batch_tokens"].string_value) for name in ("s", "m")}
    assert budgets == {"s": expected, "m": ServingOptions().max_batch_tokens}
    assert encoder_token_budget(splade, ServingOptions(max_batch_tokens=1024)) == max(splade.max_length, 1024)


@pytest.mark.parametrize(("changes", "message"), [
    ({"execution_provider": "tpu"}, "--execution-provider must be cpu or cuda"),
    ({"target": Target.CONTAINER, "execution_provider": "cuda"}, "--execution-provider applies to the cpu target"),
    ({"length_buckets": (16, 32)}, "apply to --target container"),
    ({"onnx_tensorrt": True}, "apply to --target container"),
])
def test_serving_options_refuse_what_no_repository_serves_from_python_too(changes, message):
    """The checks live in the options class: `build_repository` called from Python gets them as
    `prensa repo build` does."""
    with pytest.raises(ValueError, match=message):
        ServingOptions(**changes)
