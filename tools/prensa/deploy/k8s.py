"""Kubernetes manifests for one rendered model repository, from the settings compose.yaml uses.

Each pod runs Triton and the gateway side by side, the gateway calling its own Triton on
127.0.0.1: a replica is a whole serving unit, and the Service balances HTTP connections across
replicas. Separate gateway and Triton Deployments would pin each gateway's long-lived gRPC
channel (one HTTP/2 connection) to a single Triton pod, so added Triton replicas would sit idle.

Triton's HTTP and gRPC endpoints have no authentication, so in the pod they bind loopback,
where only the gateway (which checks the API key) reaches them, and the Service carries the
gateway alone unless `expose_triton` asks for Triton's ports too. Triton's metrics endpoint
(read-only counters) binds every interface and stays on the Service: Prometheus scrapes it per pod
for the autoscaling metric, and the gateway does not relay Triton's series.

The HorizontalPodAutoscaler scales on the time requests wait in Triton's queues before an
encoder runs them, per pod, which prometheus-adapter computes from two counters Triton exports:
queueing is what clients feel, while a GPU server's CPU use says little about its load.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import yaml
from tritonclient.grpc import model_config_pb2

from prensa.addresses import GATEWAY_PORT, LOOPBACK
from prensa.export.formats.tensorrt import SERVING_TRITON
from prensa.triton.config import config_parameters, parse_pbtxt
from prensa.triton.launcher import TritonPorts
from prensa.triton.repo import Pipeline, encoder_model, served_pipeline

Manifest = dict[str, Any]

# compose.yaml runs the same images, ports, command and shared-memory size; a unit test keeps them equal.
TRITON_PORTS = TritonPorts()
TRITON_IMAGE = f"prensa-tritonserver:{SERVING_TRITON}-py3"
GATEWAY_IMAGE = f"prensa-gateway:{version('prensa')}"
MODELS_PATH = "/models"
TRITON_COMMAND = [
    "tritonserver",
    f"--model-repository={MODELS_PATH}",
    "--strict-readiness=true",
    "--exit-on-error=true",
    "--log-verbose=0",
    # as prensa's own launcher: the rendered configs are complete (see triton.launcher)
    "--disable-auto-complete-config",
]
# In a pod, beside compose.yaml's command (where the gateway reaches Triton from another container).
# Triton binds metrics where it binds HTTP unless told otherwise.
TRITON_LOOPBACK = [
    f"--http-address={LOOPBACK}",
    f"--grpc-address={LOOPBACK}",
    "--metrics-address=0.0.0.0",
]
# Probes run inside the container (kubelet's httpGet cannot reach loopback), as compose.yaml's healthcheck.
PROBE_SCRIPT = (
    "import urllib.request; urllib.request.urlopen('http://{host}:{port}{path}', timeout=4)"
)
SHM_GB = 4  # Python-backend stages exchange tensors through /dev/shm
# The Triton container's memory when `--memory` is not given, from the repository (`triton_memory`):
# /dev/shm, tritonserver itself, each Python stub, and each encoder instance's graph plus what its
# attention holds in its largest pass: as many max-length rows as the token budget and row limit
# admit, times heads x length x length floats, times the copies onnxruntime keeps of those scores
# (measured: docs/performance.md). A graph whose heads are unknown (adopted) counts three times its size.
TRITON_BASE_GIB = 1.0
STUB_GIB = 0.1
ATTENTION_COPIES = {"int8": 2.5}  # by the served dtype; others 1.25
ENCODER_GRAPH_FACTOR = 3.0
STARTUP_BUDGET_S = 15 * 60  # compose.yaml's start_period: a first start may build TensorRT engines

# Triton's counters behind the autoscaling metric, and the name prometheus-adapter gives the quotient.
QUEUE_SERIES = "nv_inference_queue_duration_us"
SUCCESS_SERIES = "nv_inference_request_success"
QUEUE_METRIC = "prensa_encoder_queue_us_per_request"
RATE_WINDOW = "1m"
SCRAPE_INTERVAL = "15s"

GPU_RESOURCE = "nvidia.com/gpu"
KUSTOMIZE_RESOURCES = (
    "namespace.yaml",
    "deployment.yaml",
    "service.yaml",
    "hpa.yaml",
    "servicemonitor.yaml",
)
ADAPTER_VALUES = "prometheus-adapter-values.yaml"


@dataclass(frozen=True)
class Stage:
    """One Triton model of an ensemble, as its config.pbtxt declares it."""

    model: str
    gpu: bool  # a KIND_GPU instance group, or a Python encoder on onnxruntime's CUDA provider
    instances: int
    python: bool  # Python backend: one process per instance
    threads: int  # onnxruntime intra-op threads of a Python encoder; 0 when not pinned
    # the model files its instances load (graph, weights, engine)
    graph_bytes: int = field(default=0, compare=False)
    # an encoder's largest pass's attention; 0: unknown
    attention_bytes: int = field(default=0, compare=False)

    @property
    def memory_bytes(self) -> float:
        """What its instances hold at most (see ATTENTION_COPIES)."""
        if self.graph_bytes and not self.attention_bytes:
            return self.instances * ENCODER_GRAPH_FACTOR * self.graph_bytes
        return self.instances * (self.graph_bytes + self.attention_bytes)

    @property
    def cores(self) -> int:
        """CPU cores the stage keeps busy under load: one per Python process, times its pinned threads."""
        return self.instances * max(self.threads, 1) if self.python else 0


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: str
    encoder: Stage
    stages: tuple[Stage, ...]  # every ensemble step, the encoder included
    # onnxruntime's TensorRT engine cache directory, when the encoder has one
    accelerator_cache: str | None


GRAPH_SUFFIXES = (".onnx", ".data", ".onnx_data", ".plan")  # what an encoder's version folder loads


def _graph_bytes(version_dir: Path) -> int:
    return sum(
        p.stat().st_size
        for p in version_dir.glob("*")
        if p.is_file() and p.name.endswith(GRAPH_SUFFIXES)
    )


def _attention_bytes(parameters: dict[str, str], served: dict[str, str]) -> int:
    """The largest pass's attention scores of an encoder that names its heads: the rows of the
    served max length its token budget admits, x heads x length x length floats, x the copies
    onnxruntime keeps of them."""
    if "attention_heads" not in parameters or "max_length" not in served:
        return 0
    length = int(served["max_length"])
    rows = max(1, int(parameters.get("max_batch_tokens", length)) // length)
    rows = min(rows, int(parameters.get("max_rows", rows)))  # int8 graphs run one row a pass
    copies = ATTENTION_COPIES.get(served.get("dtype", "fp32"), 1.25)
    return int(copies * rows * int(parameters["attention_heads"]) * length * length * 4)


def _stage(
    name: str, config: model_config_pb2.ModelConfig, version_dir: Path, served: dict[str, str]
) -> Stage:
    parameters = config_parameters(config)
    kinds = [
        model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) for group in config.instance_group
    ]
    return Stage(
        model=name,
        gpu="KIND_GPU" in kinds or parameters.get("execution_provider") == "cuda",
        instances=sum(max(group.count, 1) for group in config.instance_group) or 1,
        python=config.backend == "python",
        threads=int(parameters.get("intra_op_threads", "0")),
        graph_bytes=_graph_bytes(version_dir),
        attention_bytes=_attention_bytes(parameters, served),
    )


def _accelerator_cache(config: model_config_pb2.ModelConfig) -> str | None:
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if "trt_engine_cache_path" in accelerator.parameters:
            return cast(str, accelerator.parameters["trt_engine_cache_path"])
    return None


def read_repository(repo: Path) -> list[ServedModel]:
    """The prensa ensembles of a repository rendered by `prensa repo build`, with their stages."""
    configs = {
        path.parent.name: parse_pbtxt(path.read_text())
        for path in sorted(repo.glob("*/config.pbtxt"))
    }
    models = []
    for name, config in configs.items():
        pipeline = served_pipeline(config)
        if pipeline is None:
            continue
        # A fused model is its own single step, and its own encoder.
        steps = (
            [name]
            if pipeline is Pipeline.FUSED
            else [step.model_name for step in config.ensemble_scheduling.step]
        )
        missing = [step for step in steps if step not in configs]
        if missing:
            raise ValueError(
                f"{repo}: ensemble {name} runs {', '.join(missing)}, which the repository lacks"
            )
        stages = tuple(
            _stage(step, configs[step], repo / step / "1", config_parameters(config))
            for step in steps
        )
        encoder_name = encoder_model(name, pipeline)
        encoder = next((stage for stage in stages if stage.model == encoder_name), None)
        if encoder is None:
            raise ValueError(
                f"{repo}: ensemble {name} has no {encoder_name} step; "
                "re-render it with `prensa repo build`"
            )
        models.append(
            ServedModel(
                name,
                config_parameters(config)["task"],
                encoder,
                stages,
                _accelerator_cache(configs[encoder_name]),
            )
        )
    if not models:
        raise ValueError(f"{repo} holds no prensa ensembles; render one with `prensa repo build`")
    return models


@dataclass(frozen=True, kw_only=True)
class K8sOptions:
    repo_image: str | None = None  # an init container copies the repository out of this image
    repo_claim: str | None = None  # or this PersistentVolumeClaim holds it, mounted read-only
    namespace: str = "prensa"
    name: str = "prensa"
    registry: str | None = None  # prefix of the Triton and gateway images, e.g. ghcr.io/acme
    gpus: int | None = None  # per pod; None: 1 when a stage runs on the GPU, else 0
    # per Triton container, request and limit; None: `triton_memory` of the repository
    memory: str | None = None
    min_replicas: int = 1
    max_replicas: int = 4
    target_queue_ms: float = 50.0  # average encoder queue time per request the autoscaler aims at
    prometheus_url: str = "http://kube-prometheus-stack-prometheus.monitoring.svc"
    prometheus_port: int = 9090
    monitor_labels: tuple[tuple[str, str], ...] = (("release", "kube-prometheus-stack"),)
    expose_triton: bool = False  # Triton's HTTP and gRPC on every pod interface and on the Service

    def __post_init__(self) -> None:
        if (self.repo_image is None) == (self.repo_claim is None):
            raise ValueError(
                "give the model repository as exactly one of an image or a PersistentVolumeClaim"
            )
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"replicas need 1 <= min <= max, got {self.min_replicas} and {self.max_replicas}"
            )
        if self.target_queue_ms <= 0:
            raise ValueError("the target queue time must be positive")

    def image(self, name: str) -> str:
        return f"{self.registry.rstrip('/')}/{name}" if self.registry else name

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/part-of": "prensa"}

    def metadata(self, **extra: Any) -> Manifest:
        return {"name": self.name, "namespace": self.namespace, "labels": self.labels, **extra}


def pod_gpus(models: list[ServedModel], options: K8sOptions) -> int:
    needs_gpu = [stage.model for model in models for stage in model.stages if stage.gpu]
    gpus = options.gpus if options.gpus is not None else int(bool(needs_gpu))
    if needs_gpu and gpus < 1:
        raise ValueError(f"{', '.join(needs_gpu)} run on the GPU: a pod needs at least one")
    return gpus


def _http_probe(path: str, port: str, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def _triton_probe(path: str, period_s: int, failures: int) -> Manifest:
    script = PROBE_SCRIPT.format(host=LOOPBACK, port=TRITON_PORTS.http, path=path)
    return {
        "exec": {"command": ["python3", "-c", script]},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def triton_ports(options: K8sOptions) -> list[tuple[str, int]]:
    """Triton's ports reachable from outside the pod, by name."""
    exposed = (
        [("http", TRITON_PORTS.http), ("grpc", TRITON_PORTS.grpc)] if options.expose_triton else []
    )
    return [*exposed, ("metrics", TRITON_PORTS.metrics)]


def triton_memory(models: list[ServedModel]) -> str:
    """The Triton container's memory for these models, whole GiB (see ATTENTION_COPIES)."""
    stages = {stage.model: stage for model in models for stage in model.stages}.values()
    stubs = sum(stage.instances for stage in stages if stage.python)
    encoders = sum(stage.memory_bytes for stage in stages) / 2**30
    return f"{math.ceil(SHM_GB + TRITON_BASE_GIB + STUB_GIB * stubs + encoders)}Gi"


def _triton_container(models: list[ServedModel], options: K8sOptions) -> Manifest:
    gpus = pod_gpus(models, options)
    cores = max(sum(stage.cores for model in models for stage in model.stages), 1)
    memory = options.memory or triton_memory(models)
    limits: dict[str, Any] = {"memory": memory}
    requests: dict[str, Any] = {"cpu": str(cores), "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = gpus
    mounts = [
        {"name": "model-repo", "mountPath": MODELS_PATH, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    caches = sorted({posixpath.dirname(m.accelerator_cache) for m in models if m.accelerator_cache})
    mounts += [{"name": f"trt-cache-{i}", "mountPath": path} for i, path in enumerate(caches)]
    return {
        "name": "triton",
        "image": options.image(TRITON_IMAGE),
        "command": TRITON_COMMAND if options.expose_triton else TRITON_COMMAND + TRITON_LOOPBACK,
        "ports": [{"name": name, "containerPort": port} for name, port in triton_ports(options)],
        "resources": {"requests": requests, "limits": limits},
        # Ready once every model loaded and ran its warmup (--strict-readiness); the startup probe
        # holds liveness off while engines build, as compose.yaml's start_period does.
        "startupProbe": _triton_probe("/v2/health/ready", 10, STARTUP_BUDGET_S // 10),
        "readinessProbe": _triton_probe("/v2/health/ready", 5, 3),
        "livenessProbe": _triton_probe("/v2/health/live", 10, 6),
        "volumeMounts": mounts,
    }


def _gateway_container(options: K8sOptions) -> Manifest:
    return {
        "name": "gateway",
        "image": options.image(GATEWAY_IMAGE),
        "command": [
            "prensa",
            "gateway",
            "--triton-url",
            f"{LOOPBACK}:{TRITON_PORTS.grpc}",
            "--repo",
            MODELS_PATH,
            "--host",
            "0.0.0.0",
            "--port",
            str(GATEWAY_PORT),
        ],
        "ports": [{"name": "gateway", "containerPort": GATEWAY_PORT}],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        # /health is 503 until Triton and every model are ready: right for readiness, wrong for
        # liveness (restarting the gateway cannot make Triton ready). /metrics answers from the
        # gateway's own event loop.
        "readinessProbe": _http_probe("/health", "gateway", 5, 3),
        "livenessProbe": _http_probe("/metrics", "gateway", 10, 6),
        "volumeMounts": [{"name": "model-repo", "mountPath": MODELS_PATH, "readOnly": True}],
    }


def _repo_volume(options: K8sOptions) -> tuple[Manifest, list[Manifest]]:
    """The repository volume and, for an image, the init container that fills it."""
    if options.repo_claim:
        return {
            "name": "model-repo",
            "persistentVolumeClaim": {"claimName": options.repo_claim, "readOnly": True},
        }, []
    copy = {
        "name": "model-repo",
        "image": options.repo_image,
        "command": ["sh", "-c", f"cp -R {MODELS_PATH}/. /repo/"],
        "volumeMounts": [{"name": "model-repo", "mountPath": "/repo"}],
    }
    return {"name": "model-repo", "emptyDir": {}}, [copy]


def deployment(models: list[ServedModel], options: K8sOptions) -> Manifest:
    triton = _triton_container(models, options)
    repo_volume, init = _repo_volume(options)
    volumes = [
        repo_volume,
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GB}Gi"}},
    ]
    volumes += [
        {"name": mount["name"], "emptyDir": {}}
        for mount in triton["volumeMounts"]
        if mount["name"].startswith("trt-cache")
    ]
    pod: Manifest = {"terminationGracePeriodSeconds": 60}
    if init:
        pod["initContainers"] = init
    pod.update(containers=[triton, _gateway_container(options)], volumes=volumes)
    if GPU_RESOURCE in triton["resources"]["limits"]:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    served = ",".join(m.name for m in models)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": options.metadata(annotations={"prensa/models": served}),
        # No `replicas`: the HorizontalPodAutoscaler owns it, and re-applying must not reset it.
        "spec": {
            "selector": {"matchLabels": options.labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "progressDeadlineSeconds": STARTUP_BUDGET_S + 300,
            "template": {
                "metadata": {"labels": options.labels, "annotations": {"prensa/models": served}},
                "spec": pod,
            },
        },
    }


def service(options: K8sOptions) -> Manifest:
    """The gateway, Triton's metrics for the ServiceMonitor, and Triton's HTTP and gRPC only when
    `expose_triton` asks: they answer anyone who reaches them."""
    ports = [("gateway", GATEWAY_PORT), *triton_ports(options)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": options.metadata(),
        "spec": {
            "selector": options.labels,
            "ports": [{"name": name, "port": port, "targetPort": name} for name, port in ports],
        },
    }


def service_monitor(options: K8sOptions) -> Manifest:
    """Prometheus Operator scrapes Triton's metrics port and the gateway's /metrics, per pod."""
    metadata = options.metadata()
    metadata["labels"] = {**options.labels, **dict(options.monitor_labels)}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": options.labels},
            "endpoints": [
                {"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL},
                {"port": "gateway", "path": "/metrics", "interval": SCRAPE_INTERVAL},
            ],
        },
    }


def _model_matcher(models: list[ServedModel]) -> str:
    """A PromQL regex matching the encoders' model label; `.` is the one regex character Triton names allow."""
    return "|".join(m.encoder.model.replace(".", "\\\\.") for m in models)


def queue_query(models: list[ServedModel]) -> str:
    """Per pod: encoder queue microseconds per successful encoder request over the rate window. An
    idle pod reads 0, not NaN (the denominator is clamped), so the autoscaler can scale down."""
    selector = f'{{model=~"{_model_matcher(models)}",<<.LabelMatchers>>}}'
    per_pod = "sum(rate({series}{selector}[{window}])) by (<<.GroupBy>>)"
    queue = per_pod.format(series=QUEUE_SERIES, selector=selector, window=RATE_WINDOW)
    success = per_pod.format(series=SUCCESS_SERIES, selector=selector, window=RATE_WINDOW)
    return f"{queue}\n/ clamp_min({success}, 1e-9)"


def adapter_values(models: list[ServedModel], options: K8sOptions) -> Manifest:
    """Values for the prometheus-community/prometheus-adapter chart: one custom metrics rule."""
    rule = {
        "seriesQuery": f'{QUEUE_SERIES}{{namespace!="",pod!=""}}',
        "resources": {
            "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        },
        "name": {"matches": f"^{QUEUE_SERIES}$", "as": QUEUE_METRIC},
        "metricsQuery": queue_query(models),
    }
    return {
        "prometheus": {"url": options.prometheus_url, "port": options.prometheus_port},
        "rules": {"default": False, "custom": [rule]},
    }


def autoscaler(options: K8sOptions) -> Manifest:
    # A new replica loads and warms every model before it takes traffic: scale up steadily and
    # scale down slowly, so one burst does not make pods come and go.
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": options.metadata(),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": options.name},
            "minReplicas": options.min_replicas,
            "maxReplicas": options.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(round(options.target_queue_ms * 1000)),
                        },
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 60,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def namespace(options: K8sOptions) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": options.namespace}}


def render(models: list[ServedModel], options: K8sOptions) -> dict[str, Manifest]:
    """File name -> object; `kubectl apply -k` takes the kustomization, Helm the adapter values."""
    return {
        "namespace.yaml": namespace(options),
        "deployment.yaml": deployment(models, options),
        "service.yaml": service(options),
        "hpa.yaml": autoscaler(options),
        "servicemonitor.yaml": service_monitor(options),
        ADAPTER_VALUES: adapter_values(models, options),
        "kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": list(KUSTOMIZE_RESOURCES),
        },
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL rule) as literal blocks, as a person would write them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    )


_Dumper.add_representer(str, _represent_str)


def write_manifests(out: Path, files: dict[str, Manifest], models: list[ServedModel]) -> list[Path]:
    header = (
        "# Rendered by `prensa deploy k8s` for a model repository serving "
        f"{', '.join(m.name for m in models)}.\n# Re-render instead of editing (docs/kubernetes.md).\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, manifest in files.items():
        path = out / name
        path.write_text(header + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=120))
        written.append(path)
    return written
