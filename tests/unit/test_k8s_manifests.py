"""`prensa deploy k8s`: manifests valid against Kubernetes' own schemas, consistent with each other
and with compose.yaml, and the committed example in deploy/k8s/ reproducible from the default set."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from prensa.cli import app
from prensa.deploy import k8s
from prensa.deploy.k8s import (
    ADAPTER_VALUES,
    GATEWAY_IMAGE,
    GATEWAY_PORT,
    KUSTOMIZE_RESOURCES,
    QUEUE_METRIC,
    SHM_GB,
    TRITON_COMMAND,
    TRITON_IMAGE,
    TRITON_PORTS,
    K8sOptions,
    ServedModel,
    Stage,
    read_repository,
    render,
    triton_memory,
)
from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, Pipeline, ServingOptions, Target, build_repository

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "k8s"
# The oldest and newest Kubernetes releases whose schemas kubernetes-validate ships.
VERSIONS = (kubernetes_validate.utils.all_versions()[0], kubernetes_validate.utils.latest_version())
EXAMPLE_OPTIONS = K8sOptions(repo_image="prensa-model-repo:default")


def load(directory: Path) -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(directory.glob("*.yaml"))}


def kubernetes_objects(files: dict[str, dict]) -> list[dict]:
    return [files[name] for name in KUSTOMIZE_RESOURCES]


def assert_valid(obj: dict) -> None:
    """Strict schema check (unknown fields fail) of core kinds; the ServiceMonitor is a CRD."""
    if obj["kind"] == "ServiceMonitor":
        return
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def assert_consistent(files: dict[str, dict]) -> None:
    deployment, service, hpa = files["deployment.yaml"], files["service.yaml"], files["hpa.yaml"]
    monitor, adapter = files["servicemonitor.yaml"], files[ADAPTER_VALUES]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    container_ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports.keys()
    assert all(p["targetPort"] in container_ports for p in service_ports.values())
    for container in pod["spec"]["containers"]:
        own = {p["name"] for p in container["ports"]}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "httpGet" in container.get(probe, {}):
                assert container[probe]["httpGet"]["port"] in own, (container["name"], probe)
    mounts = {m["name"] for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
              for m in c["volumeMounts"]}
    assert mounts == {v["name"] for v in pod["spec"]["volumes"]}
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == QUEUE_METRIC
    (rule,) = adapter["rules"]["custom"]
    assert rule["name"]["as"] == QUEUE_METRIC
    assert set(files["kustomization.yaml"]["resources"]) == set(KUSTOMIZE_RESOURCES)


def test_committed_example_is_valid_and_consistent():
    files = load(EXAMPLE)
    assert set(files) == {*KUSTOMIZE_RESOURCES, ADAPTER_VALUES, "kustomization.yaml"}
    for obj in kubernetes_objects(files):
        assert_valid(obj)
    assert_consistent(files)
    triton = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "/v2/health/ready" in triton["readinessProbe"]["exec"]["command"][-1]
    assert "/v2/health/live" in triton["livenessProbe"]["exec"]["command"][-1]


def probed_url(probe: dict) -> str:
    """The URL an exec probe's python3 one-liner opens."""
    command = probe["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    return command[2].split("urlopen('")[1].split("'")[0]


def test_triton_binds_loopback_and_the_service_carries_the_gateway_and_metrics():
    """Triton's HTTP and gRPC answer anyone: only the gateway in the pod reaches them by default."""
    files = render([cpu_model("m", 1, 0)], K8sOptions(repo_image="r"))
    triton, gateway = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"]
    assert "--http-address=127.0.0.1" in triton["command"] and "--grpc-address=127.0.0.1" in triton["command"]
    assert "--metrics-address=0.0.0.0" in triton["command"]  # else it follows --http-address
    assert [p["name"] for p in triton["ports"]] == ["metrics"]
    assert [p["name"] for p in files["service.yaml"]["spec"]["ports"]] == ["gateway", "metrics"]
    assert {e["port"] for e in files["servicemonitor.yaml"]["spec"]["endpoints"]} == {"gateway", "metrics"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probed_url(triton[probe]).startswith(f"http://127.0.0.1:{TRITON_PORTS.http}/v2/health/")
    assert f"127.0.0.1:{TRITON_PORTS.grpc}" in gateway["command"]
    assert_consistent(files)


def test_expose_triton_puts_its_ports_on_the_service():
    files = render([cpu_model("m", 1, 0)], K8sOptions(repo_image="r", expose_triton=True))
    for obj in kubernetes_objects(files):
        assert_valid(obj)
    assert_consistent(files)
    triton = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert triton["command"] == TRITON_COMMAND  # every interface, as compose.yaml runs it
    assert [p["name"] for p in triton["ports"]] == ["http", "grpc", "metrics"]
    service_ports = {p["name"]: p["port"] for p in files["service.yaml"]["spec"]["ports"]}
    assert service_ports == {"gateway": GATEWAY_PORT, "http": TRITON_PORTS.http, "grpc": TRITON_PORTS.grpc,
                             "metrics": TRITON_PORTS.metrics}


def test_the_schema_check_is_strict():
    deployment = load(EXAMPLE)["deployment.yaml"]
    typo = copy.deepcopy(deployment)
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(typo)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(wrong_type)


def test_compose_runs_the_same_images_ports_and_command():
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    triton, gateway = services["triton"], services["gateway"]
    assert triton["image"] == TRITON_IMAGE and gateway["image"] == GATEWAY_IMAGE
    assert triton["command"] == TRITON_COMMAND
    assert triton["shm_size"] == f"{SHM_GB}gb"
    published = {int(port.rsplit(":", 2)[-1]) for port in triton["ports"]}
    assert published == {TRITON_PORTS.http, TRITON_PORTS.grpc, TRITON_PORTS.metrics}
    assert [int(port.rsplit(":", 2)[-1]) for port in gateway["ports"]] == [GATEWAY_PORT]


def example_repo(exports: dict[str, Path], root: Path) -> Path:
    """The offline default set, as docs/kubernetes.md builds it: fp32 models on the GPU, the int8
    reranker on the Python encoder (int8 is a CPU format)."""
    def sources(names: dict[str, str]) -> list[ModelSource]:
        return [ModelSource(name, exports[key], Manifest.read(exports[key])) for name, key in names.items()]

    build_repository(sources({"all-MiniLM-L6-v2": "minilm", "splade-tiny": "splade"}), root,
                     ServingOptions(target=Target.CONTAINER))
    build_repository(sources({"ms-marco-MiniLM-L-12-v2": "msmarco"}), root, ServingOptions())
    return root


def test_committed_example_is_what_prensa_renders_for_the_default_set(exports, tmp_path):
    repo = example_repo(exports, tmp_path / "repo")
    result = CliRunner().invoke(app, ["deploy", "k8s", "--repo", str(repo), "--repo-image",
                                      EXAMPLE_OPTIONS.repo_image, "--out", str(tmp_path / "k8s")])
    assert result.exit_code == 0, result.output
    for path in sorted(EXAMPLE.glob("*.yaml")):
        assert (tmp_path / "k8s" / path.name).read_text() == path.read_text(), \
            f"deploy/k8s/{path.name} is stale: re-render it (docs/kubernetes.md)"


def test_repository_reading(exports, tmp_path):
    models = {m.name: m for m in read_repository(example_repo(exports, tmp_path))}
    assert sorted(models) == ["all-MiniLM-L6-v2", "ms-marco-MiniLM-L-12-v2", "splade-tiny"]
    assert models["all-MiniLM-L6-v2"].encoder == Stage("all-MiniLM-L6-v2_encode", True, 1, False, 0)
    assert models["ms-marco-MiniLM-L-12-v2"].encoder == Stage("ms-marco-MiniLM-L-12-v2_encode", False, 1, True, 0)
    assert models["ms-marco-MiniLM-L-12-v2"].encoder.graph_bytes == (exports["msmarco"] / "model.onnx").stat().st_size
    assert models["splade-tiny"].task == "splade"
    stages = [s.model for s in models["splade-tiny"].stages]
    assert stages == [f"splade-tiny_{s}" for s in ("tokenize", "encode", "pool")]


def test_a_fused_model_is_its_own_encoder(exports, tmp_path):
    build_repository([ModelSource("m", exports["minilm"], Manifest.read(exports["minilm"]))], tmp_path,
                     ServingOptions(pipeline=Pipeline.FUSED, encode_instances=2, cpu_threads=1))
    (model,) = read_repository(tmp_path)
    assert model.task == "embed" and model.encoder == Stage("m", False, 2, True, 1) and model.stages == (model.encoder,)


def cpu_model(name: str, instances: int, threads: int) -> ServedModel:
    stages = (Stage(f"{name}_tokenize", False, 1, True, 0), Stage(f"{name}_encode", False, instances, True, threads),
              Stage(f"{name}_pool", False, 1, True, 0))
    return ServedModel(name, "embed", stages[1], stages, None)


def test_cpu_repository_from_a_claim_without_gpus():
    files = render([cpu_model("m.v1", 3, 2)], K8sOptions(repo_claim="prensa-models", namespace="search"))
    for obj in kubernetes_objects(files):
        assert_valid(obj)
        assert obj["metadata"].get("namespace", "search") == "search"
    assert_consistent(files)
    pod = files["deployment.yaml"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "tolerations" not in pod
    assert pod["volumes"][0] == {"name": "model-repo", "persistentVolumeClaim": {"claimName": "prensa-models",
                                                                                 "readOnly": True}}
    requests = pod["containers"][0]["resources"]["requests"]
    assert requests["cpu"] == "8" and "nvidia.com/gpu" not in requests  # 1 + 3 x 2 threads + 1
    assert 'model=~"m\\\\.v1_encode"' in files[ADAPTER_VALUES]["rules"]["custom"][0]["metricsQuery"]


def test_memory_follows_the_graphs_and_their_attention_unless_given():
    """bge-m3 in fp32 (2.27 GB, 16 heads, 8192 tokens: two max-length rows fit the default token
    budget) in two instances, and an adopted graph whose heads are unknown (three times its size):
    /dev/shm, Triton, the stubs, each instance's graph and attention; `--memory` wins."""
    heads = {"attention_heads": "16", "max_batch_tokens": "16384", "max_rows": "64"}
    attention = k8s._attention_bytes(heads, {"max_length": "8192", "dtype": "fp32"})
    assert attention == int(1.25 * 2 * 16 * 8192 * 8192 * 4)
    one_row = {**heads, "max_rows": "1"}  # an int8 graph runs one row a pass
    assert k8s._attention_bytes(one_row, {"max_length": "8192", "dtype": "int8"}) == int(2.5 * 16 * 8192 * 8192 * 4)
    assert k8s._attention_bytes(heads, {"max_length": "512", "dtype": "fp32"}) == int(1.25 * 32 * 16 * 512 * 512 * 4)
    assert k8s._attention_bytes({}, {"max_length": "512"}) == 0
    big, small = cpu_model("m3", 2, 0), cpu_model("adopted", 1, 0)
    encoder = dataclasses.replace(big.encoder, graph_bytes=2_270_000_000, attention_bytes=attention)
    big = dataclasses.replace(big, encoder=encoder, stages=(big.stages[0], encoder, big.stages[2]))
    small_encoder = dataclasses.replace(small.encoder, graph_bytes=90_000_000)
    small = dataclasses.replace(small, encoder=small_encoder, stages=(small.stages[0], small_encoder, small.stages[2]))
    expected = math.ceil(SHM_GB + 1 + 0.1 * 7 + (2 * (2_270_000_000 + attention) + 3 * 90_000_000) / 2**30)
    assert triton_memory([big, small]) == f"{expected}Gi" == "31Gi"
    for options, memory in ((K8sOptions(repo_claim="c"), "31Gi"), (K8sOptions(repo_claim="c", memory="64Gi"), "64Gi")):
        triton = render([big, small], options)["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
        assert triton["resources"]["requests"]["memory"] == triton["resources"]["limits"]["memory"] == memory


def test_an_exported_encoder_names_its_heads_for_the_memory(exports, tmp_path):
    build_repository([ModelSource("m3", exports["bge-m3"], Manifest.read(exports["bge-m3"]))], tmp_path, ServingOptions())
    (model,) = read_repository(tmp_path)
    manifest = Manifest.read(exports["bge-m3"])
    assert manifest.attention_heads == 4 and manifest.max_length == 512
    assert model.encoder.attention_bytes == int(1.25 * (16384 // 512) * 4 * 512 * 512 * 4)
    assert model.encoder.graph_bytes == (exports["bge-m3"] / "model.onnx").stat().st_size


def test_gpu_stages_need_a_gpu_and_tensorrt_caches_get_a_volume():
    gpu = Stage("e_encode", True, 2, False, 0)
    model = ServedModel("e", "m3", gpu, (Stage("e_tokenize", False, 1, True, 0), gpu), "/cache/trt/e_encode")
    with pytest.raises(ValueError, match="e_encode"):
        render([model], K8sOptions(repo_image="r", gpus=0))
    files = render([model], K8sOptions(repo_image="r", gpus=2, registry="ghcr.io/acme/"))
    assert_valid(files["deployment.yaml"])
    triton = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert triton["image"] == f"ghcr.io/acme/{TRITON_IMAGE}"
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert {"name": "trt-cache-0", "mountPath": "/cache/trt"} in triton["volumeMounts"]


def test_cli_refuses_two_repository_sources(tmp_path):
    result = CliRunner().invoke(app, ["deploy", "k8s", "--repo", str(tmp_path), "--repo-image", "a", "--repo-pvc", "b"])
    assert result.exit_code == 2 and "exactly one" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["deploy", "k8s", "--repo", str(tmp_path), "--repo-image", "a"])
    assert result.exit_code == 2 and "holds no prensa ensembles" in " ".join(result.output.split())
