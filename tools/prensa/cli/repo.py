"""`prensa repo ...`: render exported models into a Triton model repository."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prensa.manifest import Manifest, Pooling
from prensa.triton.repo import (
    DEFAULT_ENCODER_INSTANCES,
    DEFAULT_LENGTH_RATIO,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_REPO,
    ModelSource,
    Pipeline,
    ServingOptions,
    Target,
    build_repository,
    cache_refusal,
)

app = typer.Typer(help="Build Triton model repositories from exported models.", no_args_is_help=True)
console = Console(stderr=True)


def parse_model_arg(argument: str, name: str | None) -> ModelSource:
    """`DIR` or `NAME=DIR`; the name defaults to the directory's name."""
    given, _, path = argument.partition("=") if "=" in argument else (None, "", argument)
    directory = Path(path)
    return ModelSource(given or name or directory.resolve().name, directory, Manifest.read(directory))


def read_model_list(path: Path) -> list[ModelSource]:
    """A TOML file with a `[models]` table of `name = "export dir"` (relative to the file)."""
    table = tomllib.loads(path.read_text()).get("models")
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path} needs a [models] table of name = \"export directory\" entries")
    return [ModelSource(name, path.parent / directory, Manifest.read(path.parent / directory))
            for name, directory in table.items()]


@app.command()
def build(
    exports: Annotated[list[str] | None, typer.Argument(help="Export directories from `prensa export`, as DIR or NAME=DIR.")] = None,
    models_file: Annotated[Path | None, typer.Option("--models", help="TOML file whose [models] table maps names to export directories.")] = None,
    repo: Annotated[Path, typer.Option(help="Model repository to write (models already there are kept).")] = DEFAULT_REPO,
    name: Annotated[str | None, typer.Option(help="Model name when building a single export.")] = None,
    max_batch_size: Annotated[int, typer.Option(help="Rows per Triton batch (and per client request).")] = DEFAULT_MAX_BATCH_SIZE,
    queue_delay_us: Annotated[int, typer.Option(help="Dynamic batcher max queue delay, microseconds (0: batch what is queued; requests pile up behind a busy encoder).")] = ServingOptions.queue_delay_us,
    max_queue_size: Annotated[int, typer.Option(min=0, help="Requests queued per stage before Triton rejects; 0 (default): unbounded, the gateway's --max-concurrent-requests answers 429 instead. A bound costs latency: Triton 2.51 then now and then leaves a request ~0.5 s in the queue.")] = ServingOptions.max_queue_size,
    instances: Annotated[int, typer.Option(min=1, help="Encoder instances (processes); one uses every core (its onnxruntime threads spin only when it is alone).")] = DEFAULT_ENCODER_INSTANCES,
    cpu_threads: Annotated[int, typer.Option(help="onnxruntime intra-op threads per encoder instance; 0 = all cores.")] = ServingOptions.cpu_threads,
    max_batch_tokens: Annotated[int, typer.Option(help="Token budget of one encoder forward pass (rows x padded length).")] = DEFAULT_MAX_BATCH_TOKENS,
    length_ratio: Annotated[float, typer.Option(help="Start a new sub-batch when a row is this many times longer than the shortest.")] = DEFAULT_LENGTH_RATIO,
    pooling: Annotated[Pooling | None, typer.Option(help="Override the exported pooling for dense outputs.")] = ServingOptions.pooling,
    target: Annotated[Target, typer.Option(help="cpu: Python-backend encoder (pip Triton, `prensa serve`); container: native GPU encoder for the official Triton container (compose.yaml, docs/gpu.md).")] = ServingOptions.target,
    execution_provider: Annotated[str, typer.Option(help="cpu target: onnxruntime provider of the Python encoder, cpu or cuda (cuda needs onnxruntime-gpu where Triton runs).")] = ServingOptions.execution_provider,
    length_buckets: Annotated[str | None, typer.Option(help="container target: comma-separated pad lengths (the max length is always the last); default powers of two from 16.")] = None,
    onnx_tensorrt: Annotated[bool, typer.Option(help="container target, exports without model.plan: run the onnxruntime backend with TensorRT as its accelerator (fp16, engine cache).")] = ServingOptions.onnx_tensorrt,
    trt_cache_dir: Annotated[str, typer.Option(help="container target with --onnx-tensorrt: engine cache directory inside the container.")] = ServingOptions.trt_cache_dir,
    pipeline: Annotated[Pipeline, typer.Option(help="ensemble: tokenize -> encode -> pool models; fused: one Python model per export, two process hops fewer per request (cpu target only; `prensa bench` compares both).")] = ServingOptions.pipeline,
    response_cache: Annotated[bool, typer.Option(help="Turn Triton's response cache on for embedding and SPLADE ensembles: an exact repeat is answered without the encoder. Needs `prensa serve --cache-size`; other models are listed and left uncached (docs/operations.md#response-cache).")] = ServingOptions.response_cache,
) -> None:
    """Render tokenize -> encode -> pool ensembles (or fused models) for each export into REPO."""
    exports = exports or []
    try:
        buckets = tuple(int(b) for b in length_buckets.split(",") if b.strip()) if length_buckets else ()
    except ValueError as exc:
        raise typer.BadParameter("--length-buckets takes comma-separated integers, e.g. 16,32,64,128") from exc
    try:
        options = ServingOptions(max_batch_size=max_batch_size, queue_delay_us=queue_delay_us,
                                 max_queue_size=max_queue_size, encode_instances=instances, cpu_threads=cpu_threads,
                                 max_batch_tokens=max_batch_tokens, length_ratio=length_ratio,
                                 execution_provider=execution_provider, pooling=pooling, target=target,
                                 length_buckets=buckets, onnx_tensorrt=onnx_tensorrt, trt_cache_dir=trt_cache_dir,
                                 pipeline=pipeline, response_cache=response_cache)
    except ValueError as exc:  # the options class's own checks, named by flag
        raise typer.BadParameter(str(exc)) from exc
    if name and len(exports) > 1:
        raise typer.BadParameter("--name applies to a single export; use NAME=DIR for several")
    if not exports and not models_file:
        raise typer.BadParameter("give export directories, a --models file, or both")
    try:
        models = [parse_model_arg(argument, name) for argument in exports]
        models += read_model_list(models_file) if models_file else []
    except (FileNotFoundError, ValueError, tomllib.TOMLDecodeError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    try:
        written = build_repository(models, repo, options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"wrote {len(written)} models to {repo}: " + ", ".join(written))
    if response_cache:
        refusals = {model.name: cache_refusal(model.manifest.task, pipeline) for model in models}
        cached = [name for name, refusal in refusals.items() if refusal is None]
        console.print(f"response cache on: {', '.join(cached) or 'none'} (serve with --cache-size BYTES)")
        for name, refusal in refusals.items():
            if refusal:
                console.print(f"[yellow]not cached:[/] {name}: {refusal}")
