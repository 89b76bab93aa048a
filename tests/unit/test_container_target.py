"""The GPU path: container-target configs (against golden files), fp16 and TensorRT exports,
length buckets, and the compose stack. TensorRT builds need TensorRT and a CUDA GPU; where they
are missing those tests are skipped, saying so, never faked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from prensa.cli import app
from prensa.deploy.k8s import TRITON_COMMAND
from prensa.export.agreement import agreement, min_cosine, output_vectors
from prensa.export.formats.tensorrt import (
    SERVING_TENSORRT,
    SERVING_TRITON,
    engine_profile,
    missing_requirements,
)
from prensa.export.pipeline import ExportFormat, ExportOptions, export_model
from prensa.manifest import MANIFEST_FILE, Manifest, TensorRTEngine
from prensa.stages import load_stage
from prensa.triton.config import parse_pbtxt
from prensa.triton.native import WARMUP_TOKENS, length_buckets, warmup_shapes
from prensa.triton.repo import ModelSource, ServingOptions, Target, build_repository

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
MISSING = missing_requirements()
NO_TENSORRT = f"needs {' and '.join(MISSING)}" if MISSING else ""
CONTAINER = ServingOptions(target=Target.CONTAINER)
tokenize = load_stage("tokenize")
encode = load_stage("encode")
pool = load_stage("pool")


def assert_golden(path: Path, name: str) -> None:
    """A rendered config.pbtxt equals tests/golden/<name>.pbtxt and parses with Triton's schema.
    PRENSA_UPDATE_GOLDEN=1 rewrites the golden file instead (review the diff before committing)."""
    golden = GOLDEN / f"{name}.pbtxt"
    text = path.read_text()
    if os.environ.get("PRENSA_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{path} differs from {golden}"
    parse_pbtxt(text)


def render(exports: dict[str, Path], names: list[str], root: Path, options: ServingOptions) -> Path:
    build_repository([ModelSource(n, exports[n], Manifest.read(exports[n])) for n in names], root, options)
    return root


def with_engine(export: Path, target: Path, max_batch: int = 64) -> Path:
    """The export's manifest and tokenizer plus an engine entry: what config rendering reads. The
    plan file is a placeholder; rendering links it and never opens it."""
    target.mkdir(parents=True)
    manifest = Manifest.read(export)
    shutil.copy2(export / manifest.tokenizer_file, target / manifest.tokenizer_file)
    (target / "model.plan").write_bytes(b"placeholder: config rendering only")
    profile = engine_profile(manifest.max_length, max_batch=max_batch, opt_batch=8, opt_length=None)
    replace(manifest, tensorrt=TensorRTEngine("model.plan", "fp16", f"{SERVING_TENSORRT}.0", profile)).write(target)
    return target


@pytest.fixture(scope="module")
def container_repo(tmp_path_factory, unfused_exports):
    return render(unfused_exports, ["minilm", "reranker", "bge-m3"], tmp_path_factory.mktemp("container"),
                  replace(CONTAINER, onnx_tensorrt=True))


def test_cpu_target_stays_the_default_and_unchanged(tmp_path, exports):
    repo = render(exports, ["minilm"], tmp_path, ServingOptions())
    assert_golden(repo / "minilm_encode" / "config.pbtxt", "cpu/minilm_encode")
    assert_golden(repo / "minilm_tokenize" / "config.pbtxt", "cpu/minilm_tokenize")
    assert ServingOptions().target is Target.CPU


def test_container_encoders_match_golden_configs(container_repo):
    """Goldens from all-MiniLM-L6-v2, whose tokenizer ships fixed (the tiny models' are trained on
    the fly, so their warmup lengths could move between tokenizers releases)."""
    assert_golden(container_repo / "minilm_encode" / "config.pbtxt", "container/minilm_encode_onnx_tensorrt")
    assert_golden(container_repo / "minilm_tokenize" / "config.pbtxt", "container/minilm_tokenize")


def test_container_encoder_is_native_on_the_gpu_and_batches_equal_shapes(container_repo):
    encode = parse_pbtxt((container_repo / "minilm_encode" / "config.pbtxt").read_text())
    assert encode.backend == "onnxruntime" and encode.instance_group[0].kind == encode.instance_group[0].KIND_GPU
    assert not any(i.allow_ragged_batch for i in encode.input) and encode.model_warmup
    assert (container_repo / "minilm_encode" / "1" / "model.onnx").exists()
    assert not (container_repo / "minilm_encode" / "1" / "model.py").exists()
    buckets = length_buckets(256)
    warmed = [(w.batch_size, w.inputs["input_ids"].dims[0]) for w in encode.model_warmup]
    assert warmed == warmup_shapes(buckets, encode.max_batch_size) and {(1, b) for b in buckets} <= set(warmed)
    for warmup in encode.model_warmup:  # bucket-shaped samples, one file per input and bucket
        for _name, data in warmup.inputs.items():
            assert set(data.dims) <= set(buckets) and len(data.dims) == 1
            assert (container_repo / "minilm_encode" / "warmup" / data.input_data_file).stat().st_size == data.dims[0] * 8
    tokenize_config = parse_pbtxt((container_repo / "minilm_tokenize" / "config.pbtxt").read_text())
    assert tokenize_config.parameters["length_buckets"].string_value == "16,32,64,128,256"
    # Python stages stay on the CPU, and pool still reads ragged inputs.
    pool_config = parse_pbtxt((container_repo / "minilm_pool" / "config.pbtxt").read_text())
    assert pool_config.backend == "python" and pool_config.instance_group[0].kind == pool_config.instance_group[0].KIND_CPU


def test_ensemble_feeds_a_native_encoder_exactly_its_graph_inputs(container_repo):
    """XLM-R graphs take no token_type_ids; a native backend refuses inputs its model lacks."""
    ensemble = parse_pbtxt((container_repo / "reranker" / "config.pbtxt").read_text())
    tokenize_step, encode_step, _pool_step = ensemble.ensemble_scheduling.step
    assert set(encode_step.input_map) == {"input_ids", "attention_mask"}
    assert set(tokenize_step.output_map) == {"input_ids", "attention_mask"}
    encode = parse_pbtxt((container_repo / "reranker_encode" / "config.pbtxt").read_text())
    assert [i.name for i in encode.input] == ["input_ids", "attention_mask"]
    trt = encode.optimization.execution_accelerators.gpu_execution_accelerator[0].parameters
    assert trt["trt_profile_max_shapes"] == "input_ids:64x512,attention_mask:64x512"
    assert trt["trt_engine_cache_path"] == "/cache/trt/reranker_encode"


def test_bge_m3_encoder_returns_every_head_per_token(container_repo):
    encode = parse_pbtxt((container_repo / "bge-m3_encode" / "config.pbtxt").read_text())
    assert {o.name: list(o.dims) for o in encode.output} == {
        "last_hidden_state": [-1, 32], "token_weights": [-1], "colbert_vecs": [-1, 32]}
    ensemble = parse_pbtxt((container_repo / "bge-m3" / "config.pbtxt").read_text())
    assert set(ensemble.ensemble_scheduling.step[2].input_map) == {
        "input_ids", "attention_mask", "last_hidden_state", "token_weights", "colbert_vecs"}


def test_plan_exports_render_a_tensorrt_platform(tmp_path, exports):
    engine_export = with_engine(exports["minilm"], tmp_path / "minilm-trt")
    repo = render({"minilm-trt": engine_export}, ["minilm-trt"], tmp_path / "repo", CONTAINER)
    assert_golden(repo / "minilm-trt_encode" / "config.pbtxt", "container/minilm_encode_plan")
    encode = parse_pbtxt((repo / "minilm-trt_encode" / "config.pbtxt").read_text())
    assert encode.platform == "tensorrt_plan" and encode.default_model_filename == "model.plan"
    assert sorted(p.name for p in (repo / "minilm-trt_encode" / "1").iterdir()) == ["model.plan"]
    ensemble = parse_pbtxt((repo / "minilm-trt" / "config.pbtxt").read_text())
    assert ensemble.parameters["dtype"].string_value == "fp16"


def test_batch_larger_than_the_engine_profile_is_refused(tmp_path, exports):
    engine_export = with_engine(exports["minilm"], tmp_path / "small", max_batch=16)
    with pytest.raises(ValueError, match="--trt-max-batch"):
        render({"small": engine_export}, ["small"], tmp_path / "repo", CONTAINER)


def test_int8_graphs_are_refused_on_the_container_target(tmp_path, exports):
    result = CliRunner().invoke(app, ["repo", "build", f"msmarco={exports['msmarco']}", "--target", "container",
                                      "--repo", str(tmp_path / "repo")])
    assert result.exit_code == 2 and "int8" in result.output and "--target cpu" in " ".join(result.output.split())


def test_fused_graphs_are_refused_for_tensorrt_through_onnxruntime(tmp_path, exports):
    result = CliRunner().invoke(app, ["repo", "build", f"m={exports['minilm']}", "--target", "container",
                                      "--onnx-tensorrt", "--repo", str(tmp_path / "repo")])
    assert result.exit_code == 2 and "--no-fuse-ops" in " ".join(result.output.split())


def test_repo_build_cli_targets_and_providers(tmp_path, exports):
    runner = CliRunner()
    result = runner.invoke(app, ["repo", "build", f"m={exports['minilm']}", "--target", "container",
                                 "--length-buckets", "64,32,1000", "--repo", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    config = parse_pbtxt((tmp_path / "c" / "m_tokenize" / "config.pbtxt").read_text())
    assert config.parameters["length_buckets"].string_value == "32,64,256"
    result = runner.invoke(app, ["repo", "build", f"m={exports['minilm']}", "--execution-provider", "cuda",
                                 "--repo", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    config = parse_pbtxt((tmp_path / "g" / "m_encode" / "config.pbtxt").read_text())
    assert config.backend == "python" and config.parameters["execution_provider"].string_value == "cuda"
    result = runner.invoke(app, ["repo", "build", f"m={exports['minilm']}", "--target", "container",
                                 "--execution-provider", "cuda", "--repo", str(tmp_path / "x")])
    assert result.exit_code == 2


def test_length_buckets_end_at_max_length():
    assert length_buckets(256) == [16, 32, 64, 128, 256]
    assert length_buckets(8192)[-2:] == [4096, 8192]
    assert length_buckets(300) == [16, 32, 64, 128, 256, 300]
    assert length_buckets(512, (100, 16, 600)) == [16, 100, 512]
    assert length_buckets(8) == [8]


@pytest.mark.parametrize("max_length, max_batch", [(256, 64), (8192, 32), (512, 8), (16, 1)])
def test_warmup_covers_each_bucket_alone_and_batches_within_the_token_budget(max_length, max_batch):
    buckets = length_buckets(max_length)
    shapes = warmup_shapes(buckets, max_batch)
    assert [length for rows, length in shapes if rows == 1] == buckets  # a lone request of any bucket
    assert all(1 <= rows <= max_batch and (rows == 1 or rows * length <= WARMUP_TOKENS) for rows, length in shapes)
    assert len(set(shapes)) == len(shapes)
    assert (max_batch, 16) in shapes  # the largest batch, on the shortest bucket


def test_tokenizer_pads_each_request_to_its_bucket(exports):
    tok = tokenize.load_tokenizer(exports["minilm"] / "tokenizer.json", 256)
    encodings = tok.encode_batch(["short text", "a somewhat longer text that needs more tokens than that"])
    padded = tokenize.pad_encodings(encodings, 0, [16, 32, 256])
    longest = max(len(e.ids) for e in encodings)
    assert padded["input_ids"].shape == (2, 16) and padded["attention_mask"].sum(axis=1).max() == longest
    assert tokenize.pad_encodings(encodings, 0)["input_ids"].shape == (2, longest)
    assert tokenize.bucket_width(17, [16, 32]) == 32 and tokenize.bucket_width(5, []) == 5


def test_pool_results_do_not_depend_on_bucket_padding():
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    hidden, weights = rng.normal(size=(2, 4, 8)).astype(np.float32), rng.random((2, 4)).astype(np.float32)
    ids = np.array([[0, 5, 2, 1], [0, 7, 1, 1]])
    tight = {"input_ids": ids, "attention_mask": mask, "last_hidden_state": hidden, "token_weights": weights}
    padded = {k: np.pad(v, [(0, 0), (0, 12)] + [(0, 0)] * (v.ndim - 2)) for k, v in tight.items()}  # to bucket 16
    args = ("mean", True, np.array([0, 1, 2]), "sigmoid")
    a, b = pool.pool_request(tight, *args), pool.pool_request(padded, *args)
    for name in ("dense", "sparse_ids", "sparse_weights", "num_tokens"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6)


def test_cosine_agreement_over_the_vectors_clients_use():
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    hidden = np.arange(18, dtype=np.float32).reshape(2, 3, 3) + 1
    assert output_vectors(hidden, mask, per_token=True).shape == (3, 3)  # real tokens only
    assert output_vectors(np.ones((4, 1)), mask, per_token=False).shape == (1, 4)  # one-logit rows: one vector
    noisy = hidden.copy()
    noisy[0, 2] = -100  # padding may differ freely
    assert agreement({"h": noisy}, {"h": hidden}, mask, {"h"})["h"][0] == pytest.approx(1.0)
    assert min_cosine(np.zeros((1, 3)), np.zeros((1, 3))) == 1.0
    assert min_cosine(np.zeros((1, 3)), np.ones((1, 3))) == 0.0
    assert min_cosine(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])) == 0.0


def test_fp16_onnx_export_is_checked_against_fp32(tmp_path, m3_dir):
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "fp16", dtype="fp16"))
    assert manifest.dtype == "fp16" and manifest.tensorrt is None
    if "skipped" in report.figures:  # neither onnxruntime provider runs this fp16 graph here
        assert "cannot run" in report.figures["skipped"]
    else:
        assert "min cosine >= 0.999" in report.heading and report.ok, report
        assert set(report.figures) == {"last_hidden_state", "token_weights", "colbert_vecs", "fused ops", "calibration",
                                       "packed graph"}
    # Fused in fp32 before the conversion, whose casts would hide the patterns from the fuser.
    assert "SkipLayerNormalization" in manifest.fused_ops, report


@pytest.mark.skipif(not MISSING, reason="TensorRT and a CUDA GPU are present: the build test runs instead")
def test_tensorrt_export_says_what_is_missing(tmp_path, m3_dir):
    result = CliRunner().invoke(app, ["export", str(m3_dir), "--out", str(tmp_path / "out"), "--format", "tensorrt"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "--format tensorrt needs" in output
    assert all(" ".join(requirement.split()) in output for requirement in MISSING)
    assert not (tmp_path / "out").exists()  # refused before any export work


@pytest.mark.skipif(bool(MISSING), reason=NO_TENSORRT)
def test_tensorrt_export_builds_a_checked_engine_and_serves_it(tmp_path, m3_dir):
    manifest, report = export_model(ExportOptions(str(m3_dir), tmp_path / "trt", format=ExportFormat.TENSORRT,
                                                  dtype="fp16", trt_max_batch=16))
    assert report.ok, report
    assert manifest.dtype == "fp32" and manifest.tensorrt.precision == "fp16"
    assert manifest.tensorrt.profile.max_batch == 16 and manifest.tensorrt.profile.max_length == manifest.max_length
    assert (tmp_path / "trt" / "model.plan").stat().st_size > 0
    assert Manifest.read(tmp_path / "trt").tensorrt == manifest.tensorrt
    repo = render({"m3": tmp_path / "trt"}, ["m3"], tmp_path / "repo", replace(CONTAINER, max_batch_size=16))
    assert parse_pbtxt((repo / "m3_encode" / "config.pbtxt").read_text()).platform == "tensorrt_plan"


def test_python_encoder_asked_for_cuda_says_where_it_runs(exports, capfd):
    """`--execution-provider cuda` on a machine without onnxruntime-gpu still serves, on the CPU,
    and says so in Triton's log instead of running slowly in silence."""
    import onnxruntime as ort

    session = encode.create_session(exports["minilm"] / "model.onnx", 1, "cuda")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert session.get_providers()[0] == "CUDAExecutionProvider"
    else:
        assert session.get_providers() == ["CPUExecutionProvider"]
        assert "execution_provider cuda asked, running on CPUExecutionProvider" in capfd.readouterr().err


def test_manifest_without_engine_reads_as_before(exports):
    manifest = Manifest.read(exports["minilm"])
    assert manifest.tensorrt is None and '"tensorrt": null' in (exports["minilm"] / MANIFEST_FILE).read_text()


# compose.yaml: `docker compose config` where Docker Compose exists, a structural check everywhere.

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def compose_available() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not compose_available(), reason="Docker Compose is not installed here; the YAML checks below still run")
def test_compose_file_validates_with_docker_compose():
    result = subprocess.run(["docker", "compose", "-f", str(ROOT / "compose.yaml"), "config", "-q"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_pins_the_triton_release_whose_tensorrt_builds_our_engines():
    triton = COMPOSE["services"]["triton"]
    assert triton["build"]["args"]["TRITON_IMAGE"] == f"nvcr.io/nvidia/tritonserver:{SERVING_TRITON}-py3"
    dockerfile = (ROOT / "deploy" / triton["build"]["dockerfile"]).read_text()
    assert f"ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:{SERVING_TRITON}-py3" in dockerfile
    assert "FROM ${TRITON_IMAGE}" in dockerfile and "tokenizers" in dockerfile and "onnxruntime-gpu" in dockerfile
    for service in COMPOSE["services"].values():
        if "image" in service:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]) and not service["image"].endswith(":latest")


def test_compose_reserves_the_gpu_and_mounts_the_repository_read_only():
    triton = COMPOSE["services"]["triton"]
    device = triton["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert any(v.endswith(":/models:ro") for v in triton["volumes"])
    assert any(v.endswith(":/models:ro") for v in COMPOSE["services"]["gateway"]["volumes"])
    size = re.fullmatch(r"(\d+)([mg])b?", str(triton["shm_size"]).lower())
    assert size and int(size[1]) * (1024 if size[2] == "g" else 1) >= 1024  # Python-backend tensors cross /dev/shm
    assert triton["command"] == TRITON_COMMAND  # as `prensa deploy k8s` runs it (complete configs: no auto-complete)


def test_compose_publishes_ports_on_loopback_only():
    published = [port for service in COMPOSE["services"].values() for port in service.get("ports", [])]
    assert {p.rsplit(":", 1)[1] for p in published} == {"8000", "8001", "8002", "8080", "9090", "3000"}  # 3000: Grafana
    for port in published:
        assert port.startswith(("127.0.0.1:", "${PRENSA_BIND:-127.0.0.1}:")), port


def test_compose_gateway_and_prometheus_scrape_both_metrics_endpoints():
    gateway = COMPOSE["services"]["gateway"]
    assert gateway["command"] == ["prensa", "gateway", "--triton-url", "triton:8001", "--repo", "/models",
                                  "--host", "0.0.0.0"]
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())["scrape_configs"]
    targets = {(job.get("metrics_path", "/metrics"), t) for job in scrape for c in job["static_configs"] for t in c["targets"]}
    assert targets == {("/metrics", "triton:8002"), ("/metrics", "gateway:8080")}
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in COMPOSE["services"]["prometheus"]["volumes"]
    # Its alert rules and Grafana's dashboard: tests/unit/test_alert_rules.py, tests/e2e/test_dashboard_metrics.py.
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in COMPOSE["services"]["prometheus"]["volumes"]
    assert COMPOSE["services"]["grafana"]["depends_on"] == ["prometheus"]
