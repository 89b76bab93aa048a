"""`prensa deploy ...`: deployment manifests for a rendered model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prensa.deploy.k8s import (
    ADAPTER_VALUES,
    K8sOptions,
    read_repository,
    render,
    triton_memory,
    write_manifests,
)
from prensa.triton.repo import DEFAULT_REPO

app = typer.Typer(help="Render deployment manifests for a model repository.", no_args_is_help=True)
console = Console(stderr=True)


def parse_labels(labels: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"labels are KEY=VALUE, got {label!r}")
        pairs.append((key, value))
    return tuple(pairs)


@app.command()
def k8s(
    repo: Annotated[
        Path,
        typer.Option(
            help="Model repository rendered by `prensa repo build` (read for model names, stages and instance counts)."
        ),
    ] = DEFAULT_REPO,
    repo_image: Annotated[
        str | None,
        typer.Option(
            help="Image holding the repository at /models (deploy/model-repo.Dockerfile); an init container copies it into each pod."
        ),
    ] = None,
    repo_pvc: Annotated[
        str | None,
        typer.Option(
            help="Instead of --repo-image: a PersistentVolumeClaim holding the repository, mounted read-only."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory to write the manifests to.")] = Path(
        "deploy/k8s"
    ),
    namespace: Annotated[str, typer.Option(help="Namespace of every object.")] = "prensa",
    name: Annotated[
        str, typer.Option(help="Name of the Deployment, Service, autoscaler and monitor.")
    ] = "prensa",
    registry: Annotated[
        str | None,
        typer.Option(
            help="Registry prefix of the Triton and gateway images (compose.yaml's names and tags)."
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(help="GPUs per pod; default 1 when any stage runs on the GPU, else 0."),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            help="Memory request and limit of the Triton container (/dev/shm counts against it). Default: from the repository: /dev/shm, Triton, each stub, and each encoder instance's graph plus its attention at the max length (docs/kubernetes.md).",
            show_default=False,
        ),
    ] = None,
    min_replicas: Annotated[int, typer.Option(help="Fewest pods the autoscaler keeps.")] = 1,
    max_replicas: Annotated[int, typer.Option(help="Most pods the autoscaler starts.")] = 4,
    target_queue_ms: Annotated[
        float,
        typer.Option(
            help="Average encoder queue time per request, per pod, the autoscaler aims at."
        ),
    ] = 50.0,
    prometheus_url: Annotated[
        str, typer.Option(help="Prometheus that prometheus-adapter queries.")
    ] = "http://kube-prometheus-stack-prometheus.monitoring.svc",
    prometheus_port: Annotated[int, typer.Option(help="Its port.")] = 9090,
    monitor_label: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE label the Prometheus Operator selects ServiceMonitors by; repeatable."
        ),
    ] = None,
    expose_triton: Annotated[
        bool,
        typer.Option(
            help="Bind Triton's HTTP and gRPC to every pod interface and put them on the Service; they have no authentication (docs/kubernetes.md)."
        ),
    ] = False,
) -> None:
    """Kubernetes manifests: Triton + gateway pods, Service, ServiceMonitor, queue-time autoscaler."""
    labels = {"monitor_labels": parse_labels(monitor_label)} if monitor_label else {}
    try:
        options = K8sOptions(
            repo_image=repo_image,
            repo_claim=repo_pvc,
            namespace=namespace,
            name=name,
            registry=registry,
            gpus=gpus,
            memory=memory,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_queue_ms=target_queue_ms,
            prometheus_url=prometheus_url,
            prometheus_port=prometheus_port,
            expose_triton=expose_triton,
            **labels,
        )
        models = read_repository(repo)
        files = render(models, options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    written = write_manifests(out, files, models)
    console.print(
        f"Triton container memory: {memory or triton_memory(models)}"
        + ("" if memory else " (from the repository's graphs; --memory sets it)")
    )
    console.print(
        f"wrote {len(written)} files to {out} for {', '.join(m.name for m in models)}: "
        f"`kubectl apply -k {out}`; prometheus-adapter: `helm install ... -f {out / ADAPTER_VALUES}`"
    )
