"""`prensa repo build`: render exported models into a Triton model repository.

Per model `<name>`: `<name>_tokenize`, `<name>_encode`, `<name>_pool` (Python backend, stage code
copied from `prensa/ensembles/`) and the ensemble `<name>` wiring them; or, with the `fused` pipeline,
one Python model `<name>` running the same stage code in one process hop (lower latency on CPU).
Serving knobs live in each `config.pbtxt` as parameters; stage code reads them at load time. The
`container` target swaps the encoder for a native GPU backend (see `prensa.triton.native`) and
pads tokens to buckets. `--response-cache` turns Triton's response cache on for the ensembles it
can key safely (`cache_refusal`).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from prensa.files import graph_data_files, link_graph_files, link_or_copy
from prensa.layouts import LAYOUTS, PairInput, of_manifest
from prensa.manifest import CALIBRATION_FILE, Manifest, Pooling, Task
from prensa.options import internal, require_positive, setting
from prensa.stages import (
    CONTRACT_FILE,
    PIPELINE_STAGES,
    contract,
    stage_model_file,
    stage_model_name,
    stage_module_name,
)
from prensa.triton import native
from prensa.triton.config import (
    ConfigDict,
    Tensor,
    config_parameters,
    dynamic_batching,
    parse_pbtxt,
    string_parameters,
    to_pbtxt,
)

WARMUP_TEXT = "prensa warms every stage up with this sentence before the model reports ready."
TOKEN_INPUTS = (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
# the exported graph's outputs, named by its manifest
ENCODER_OUTPUT = contract.ENCODER_OUTPUT_TYPE.triton


# The encoder (ensemble encode stage or fused model) runs one instance unless told otherwise. On
# CPU, its onnxruntime session uses every core and spins between operators (`allow_spinning`),
# and nothing else competes for them. Two instances took turns with a lone client's requests (slower
# per short query), gave less throughput under load, and sharing the cores they must not spin
# (docs/performance.md, "Encoder instances"). One instance used to stall now and then in Triton's
# queue; that was the queue policy (see `dynamic_batching`), not the instance count.
DEFAULT_ENCODER_INSTANCES = 1
DEFAULT_MAX_BATCH_SIZE = contract.DEFAULT_MAX_BATCH_SIZE
DEFAULT_MAX_BATCH_TOKENS = contract.DEFAULT_MAX_BATCH_TOKENS
DEFAULT_LENGTH_RATIO = contract.DEFAULT_LENGTH_RATIO

# Triton keys a cached response on the model, its version and the bytes of each input by name: not on
# the outputs the request asked for, nor on input shapes. The cached response carries only the outputs
# its first request asked for, so only layouts whose clients ask one output set of the same inputs are
# cached (`Layout.cacheable`: an embedder's `dense`, SPLADE's sparse pair).
CACHED_TASKS = tuple(layout.task for layout in LAYOUTS if layout.cacheable)


class Pipeline(str, Enum):
    # tokenize -> encode -> pool models: stages run in parallel, each inspectable
    ENSEMBLE = "ensemble"
    FUSED = "fused"  # one Python model: the same stages without two process hops (CPU target only)


def encoder_model(name: str, pipeline: Pipeline) -> str:
    """The Triton model that runs `name`'s encoder (its token counters, batch sizes, queue time)."""
    return name if pipeline is Pipeline.FUSED else stage_model_name(name, "encode")


def served_pipeline(config: model_config_pb2.ModelConfig) -> Pipeline | None:
    """The layout of a prensa model clients call (an ensemble or a fused model, both carrying `task`);
    None for its stages and for models prensa did not render."""
    parameters = config_parameters(config)
    if "task" not in parameters:
        return None
    if config.platform == "ensemble":
        return Pipeline.ENSEMBLE
    return Pipeline.FUSED if parameters.get("pipeline") == Pipeline.FUSED.value else None


class Target(str, Enum):
    CPU = "cpu"  # Python-backend encoder: onnxruntime over ragged, token-budget sub-batches
    # native GPU encoder (TensorRT plan or onnxruntime backend), length buckets
    CONTAINER = "container"


# the cpu target's Python encoder: onnxruntime's CPU or CUDA provider
EXECUTION_PROVIDERS = (
    "cpu",
    "cuda",
)
# where `repo build` writes and `serve`, `gateway`, `tune` and `deploy` read
DEFAULT_REPO = Path("model_repo")


def length_list(text: str) -> tuple[int, ...]:
    """`--length-buckets 16,32,64`: pad lengths, comma-separated."""
    try:
        return tuple(int(length) for length in text.split(",") if length.strip())
    except ValueError:
        raise ValueError("takes comma-separated integers, e.g. 16,32,64,128") from None


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    """How `repo build` renders each model; the fields are `prensa repo build`'s options."""

    max_batch_size: int = setting(
        DEFAULT_MAX_BATCH_SIZE, "Rows per Triton batch (and per client request)."
    )
    # Under load requests queue behind a busy encoder anyway; a lone query must not wait.
    queue_delay_us: int = setting(
        0,
        "Dynamic batcher max queue delay, microseconds (0: batch what is queued; requests pile up behind a busy "
        "encoder).",
    )
    max_queue_size: int = setting(
        0,
        "Requests queued per stage before Triton rejects; 0 (default): unbounded, the gateway's "
        "--max-concurrent-requests answers 429 instead. A bound costs latency: Triton then now and then leaves a "
        "request in the queue for half a second (docs/performance.md).",
    )
    encode_instances: int = setting(
        DEFAULT_ENCODER_INSTANCES,
        "Encoder instances (processes); one uses every core (its onnxruntime threads "
        "spin only when it is alone).",
        flag="--instances",
    )
    cpu_threads: int = setting(
        0, "onnxruntime intra-op threads per encoder instance; 0 = all cores."
    )
    max_batch_tokens: int = setting(
        DEFAULT_MAX_BATCH_TOKENS, "Token budget of one encoder forward pass (rows x padded length)."
    )
    length_ratio: float = setting(
        DEFAULT_LENGTH_RATIO,
        "Start a new sub-batch when a row is this many times longer than the shortest.",
    )
    instance_kind: str = internal("KIND_CPU")
    execution_provider: str = setting(
        "cpu",
        "cpu target: onnxruntime provider of the Python encoder, cpu or cuda (cuda needs onnxruntime-gpu "
        "where Triton runs).",
    )
    pooling: Pooling | None = setting(None, "Override the exported pooling for dense outputs.")
    target: Target = setting(
        Target.CPU,
        "cpu: Python-backend encoder (pip Triton, `prensa serve`); container: native GPU encoder for "
        "the official Triton container (compose.yaml, docs/gpu.md).",
    )
    length_buckets: tuple[int, ...] = setting(
        (),
        "container target: comma-separated pad lengths (the max length is always the last); default powers of "
        "two from 16.",
        parse=length_list,
    )
    onnx_tensorrt: bool = setting(
        False,
        "container target, exports without model.plan: run the onnxruntime backend with TensorRT as its "
        "accelerator (fp16, engine cache).",
    )
    trt_cache_dir: str = setting(
        "/cache/trt",
        "container target with --onnx-tensorrt: engine cache directory inside the container.",
    )
    pipeline: Pipeline = setting(
        Pipeline.ENSEMBLE,
        "ensemble: tokenize -> encode -> pool models; fused: one Python model per export, two "
        "process hops fewer per request (cpu target only; `prensa bench` compares both).",
    )
    response_cache: bool = setting(
        False,
        "Turn Triton's response cache on for embedding and SPLADE ensembles: an exact repeat is answered "
        "without the encoder. Needs `prensa serve --cache-size`; other models are listed and left uncached "
        "(docs/operations.md#response-cache).",
    )

    def __post_init__(self) -> None:
        """The combinations no repository can serve, refused here so that `build_repository` called
        from Python refuses them as `prensa repo build` does (messages name the flags)."""
        require_positive(
            self, "max_batch_size", "encode_instances", "max_batch_tokens", "length_ratio"
        )
        require_positive(
            self,
            "queue_delay_us",
            "max_queue_size",
            "cpu_threads",
            allow_zero=("queue_delay_us", "max_queue_size", "cpu_threads"),
        )
        if self.execution_provider not in EXECUTION_PROVIDERS:
            raise ValueError(
                f"--execution-provider must be {' or '.join(EXECUTION_PROVIDERS)}, "
                f"got {self.execution_provider}"
            )
        if self.target is Target.CONTAINER and self.execution_provider != "cpu":
            raise ValueError(
                "--execution-provider applies to the cpu target; the container target's encoder "
                "runs on the GPU"
            )
        if self.target is Target.CPU and (self.length_buckets or self.onnx_tensorrt):
            raise ValueError("--length-buckets and --onnx-tensorrt apply to --target container")


def cache_refusal(task: Task, pipeline: Pipeline) -> str | None:
    """Why `--response-cache` leaves a model uncached, or None when its answers can be cached."""
    if pipeline is Pipeline.FUSED:
        return (
            "a fused model also takes token ids, and Triton's cache key has no input shapes nor requested "
            "outputs: the token path would get answers cached for other rows or other outputs"
        )
    if task not in CACHED_TASKS:
        return (
            f"{task.value} models are asked for different outputs of the same texts, and Triton's cache key "
            "has no requested outputs: a cached answer would lack the outputs a later request asks for"
        )
    return None


def cached_models(repo: Path) -> list[str]:
    """The models of `repo` whose config turns Triton's response cache on, sorted; a config this
    schema cannot read is left to Triton to refuse."""
    cached = []
    for path in sorted(repo.glob("*/config.pbtxt")):
        try:
            if parse_pbtxt(path.read_text()).response_cache.enable:
                cached.append(path.parent.name)
        except text_format.ParseError:
            continue
    return cached


@dataclass(frozen=True)
class ModelSource:
    name: str
    export_dir: Path
    manifest: Manifest


def _string_file(values: list[str]) -> bytes:
    """Triton's warmup format for TYPE_STRING: 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)


def _python_stage(
    name: str,
    options: ServingOptions,
    inputs: list[Tensor],
    outputs: list[Tensor],
    parameters: Mapping[str, object],
    warmup: dict[str, ConfigDict],
    instances: int = 1,
    max_batch_size: int | None = None,
) -> ConfigDict:
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size or options.max_batch_size,
        "input": [t.as_input() for t in inputs],
        "output": [t.as_output() for t in outputs],
        "dynamic_batching": dynamic_batching(options.queue_delay_us, options.max_queue_size),
        "instance_group": [{"count": instances, "kind": options.instance_kind}],
        "parameters": string_parameters(parameters),
        "model_warmup": [{"name": "sample", "batch_size": 1, "inputs": warmup}],
    }


def encoder_window(options: ServingOptions) -> int:
    """Rows Triton may merge into one `execute` of the encode stage. On CUDA at least
    `contract.GPU_WINDOW_ROWS`: a GPU pass pays its launches however few its rows, and the stage can
    only plan passes over the rows one `execute` brings (docs/gpu.md)."""
    if options.execution_provider == "cuda":
        window: int = max(options.max_batch_size, contract.GPU_WINDOW_ROWS)
        return window
    return options.max_batch_size


def encoder_rows(manifest: Manifest, options: ServingOptions) -> int:
    """Rows per forward pass. Dynamically quantised (int8) graphs scale activations per tensor,
    so a row's result would depend on its batch neighbours and their padding: run them alone."""
    return 1 if manifest.dtype == "int8" else encoder_window(options)


# A SPLADE pass holds its [tokens x vocabulary] MLM logits (and onnxruntime's copies of them) before
# the max over tokens: its token budget keeps them near this (docs/operations.md#memory-per-request).
SPLADE_LOGITS_BYTES = 256 << 20


def encoder_token_budget(manifest: Manifest, options: ServingOptions) -> int:
    """Tokens per encoder pass: the option's, lowered for SPLADE to bound its logits (never below
    one text of the model's max length)."""
    if contract.SPLADE_WEIGHTS not in of_manifest(manifest).graph_outputs:  # no vocabulary logits
        return options.max_batch_tokens
    vocab = next(o.dims[0] for o in manifest.outputs if o.name == contract.SPLADE_WEIGHTS)
    return max(
        manifest.max_length, min(options.max_batch_tokens, SPLADE_LOGITS_BYTES // (4 * vocab))
    )


def pool_parameters(manifest: Manifest, options: ServingOptions) -> dict[str, str]:
    """The pool stage's config parameters; `prensa embed-corpus --export` pools with the same."""
    pooling = options.pooling or manifest.pooling
    parameters = {
        "pooling": pooling.value if pooling else "none",
        "normalize": str(manifest.normalize).lower(),
        "drop_ids": ",".join(map(str, manifest.special_ids)),
        "activation": "sigmoid" if len(manifest.id2label) <= 1 else "softmax",
    }
    if late := manifest.late_interaction:
        parameters["query_marker_id"] = str(late.query_marker_id)
        parameters["skiplist_ids"] = ",".join(map(str, late.skiplist_ids))
    return parameters


def client_outputs(manifest: Manifest) -> list[Tensor]:
    """What the ensemble returns, by layout; docs/api.md (calling Triton directly) says how to decode each."""
    graph = {o.name: o for o in manifest.outputs}
    answers = of_manifest(manifest).answers
    outputs = []
    if contract.DENSE in answers:
        pooled = graph.get(contract.SENTENCE_EMBEDDING)
        dim = pooled.dims[0] if pooled else graph[contract.LAST_HIDDEN_STATE].dims[1]
        outputs.append(Tensor(contract.DENSE, contract.triton_type(contract.DENSE), [dim]))
    if contract.SPARSE_IDS in answers:
        outputs += [
            Tensor(n, contract.triton_type(n), [-1])
            for n in (contract.SPARSE_IDS, contract.SPARSE_WEIGHTS)
        ]
    if contract.COLBERT in answers:
        outputs.append(
            Tensor(
                contract.COLBERT,
                contract.triton_type(contract.COLBERT),
                [-1, graph[contract.COLBERT_VECS].dims[1]],
            )
        )
    if contract.LOGITS in answers:
        labels = graph[contract.LOGITS].dims
        outputs += [
            Tensor(n, contract.triton_type(n), labels) for n in (contract.LOGITS, contract.SCORES)
        ]
    outputs.append(Tensor(contract.NUM_TOKENS, contract.triton_type(contract.NUM_TOKENS), [1]))
    return outputs


class ModelRenderer:
    """Writes the four model directories of one exported model."""

    def __init__(self, model: ModelSource, repo: Path, options: ServingOptions) -> None:
        self.model, self.m, self.repo, self.options = model, model.manifest, repo, options
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model.export_dir / self.m.tokenizer_file))
        tokenizer.enable_truncation(self.m.max_length)
        pair = of_manifest(self.m).pair_input is not None
        encoding = tokenizer.encode(WARMUP_TEXT, WARMUP_TEXT if pair else None)
        self.sample_tokens = {
            contract.INPUT_IDS: np.asarray(encoding.ids, dtype=contract.INT64.numpy),
            contract.ATTENTION_MASK: np.ones(len(encoding.ids), dtype=contract.INT64.numpy),
            contract.TOKEN_TYPE_IDS: np.asarray(encoding.type_ids, dtype=contract.INT64.numpy),
        }
        self.native_encoder = options.target is Target.CONTAINER
        self.buckets: list[int] = []
        if self.native_encoder:  # warm up on a shape real requests will have
            native.check_servable(self.m, options.max_batch_size, options.onnx_tensorrt)
            self.buckets = native.length_buckets(self.m.max_length, options.length_buckets)
            self.sample_tokens = self._fit_sample(
                next(b for b in self.buckets if b >= len(encoding.ids))
            )

    def _fit_sample(self, width: int) -> dict[str, npt.NDArray[Any]]:
        """The warmup sample cut or padded to `width` tokens, as the bucketing tokenizer pads."""
        pad = contract.pad_values(self.m.pad_id)
        return {
            n: np.pad(v[:width], (0, max(width - v.shape[0], 0)), constant_values=pad[n])
            for n, v in self.sample_tokens.items()
        }

    def encoder_inputs(self) -> list[str]:
        """What the encoder takes: the Python stage accepts all three, a native backend exactly the graph's."""
        return (
            [n for n in TOKEN_INPUTS if n in self.m.inputs]
            if self.native_encoder
            else list(TOKEN_INPUTS)
        )

    def stage_dir(self, stage: str) -> Path:
        return self.repo / stage_model_name(self.model.name, stage)

    def _write(
        self,
        directory: Path,
        config: ConfigDict,
        stage: str | None,
        warmup_files: dict[str, bytes] | None = None,
    ) -> None:
        version = directory / "1"
        version.mkdir(parents=True, exist_ok=True)
        (directory / "config.pbtxt").write_text(to_pbtxt(config))
        if stage:
            shutil.copy2(stage_model_file(stage), version / "model.py")
            shutil.copy2(CONTRACT_FILE, version / CONTRACT_FILE.name)
        if warmup_files:
            (directory / "warmup").mkdir(exist_ok=True)
            for file, data in warmup_files.items():
                (directory / "warmup" / file).write_bytes(data)

    def _token_warmup(
        self, names: tuple[str, ...]
    ) -> tuple[dict[str, ConfigDict], dict[str, bytes]]:
        length = int(self.sample_tokens[contract.INPUT_IDS].shape[0])
        spec = {
            n: {"data_type": contract.triton_type(n), "dims": [length], "input_data_file": n}
            for n in names
        }
        return spec, {n: self.sample_tokens[n].tobytes() for n in names}

    def _bucket_warmup(self, names: tuple[str, ...]) -> tuple[list[ConfigDict], dict[str, bytes]]:
        """Warmup requests for a native encoder, one per `native.warmup_shapes` pair; Triton repeats
        a sample `batch_size` times, so each bucket needs one data file per input."""
        entries = [
            {
                "name": f"{rows}x{bucket}",
                "batch_size": rows,
                "inputs": {
                    n: {
                        "data_type": contract.triton_type(n),
                        "dims": [bucket],
                        "input_data_file": f"{n}_{bucket}",
                    }
                    for n in names
                },
            }
            for rows, bucket in native.warmup_shapes(self.buckets, self.options.max_batch_size)
        ]
        files = {
            f"{n}_{bucket}": tokens.tobytes()
            for bucket in self.buckets
            for n, tokens in self._fit_sample(bucket).items()
            if n in names
        }
        return entries, files

    def text_inputs(self, optional: bool = False) -> list[Tensor]:
        """`text`, and `text_pair` for pair tasks (optional for classifiers, which also take single texts,
        and LLM rerankers, which also take a pair already written into their prompt)."""
        inputs = [
            Tensor(contract.TEXT, contract.triton_type(contract.TEXT), [1], optional=optional)
        ]
        pair_input = of_manifest(self.m).pair_input
        if pair_input is not None:
            alone = pair_input is PairInput.OPTIONAL
            inputs.append(
                Tensor(
                    contract.TEXT_PAIR,
                    contract.triton_type(contract.TEXT_PAIR),
                    [1],
                    optional=optional or alone,
                )
            )
        return inputs

    def _text_warmup(self, inputs: list[Tensor]) -> tuple[dict[str, ConfigDict], dict[str, bytes]]:
        warmup = {
            t.name: {
                "data_type": contract.triton_type(t.name),
                "dims": [1],
                "input_data_file": t.name,
            }
            for t in inputs
        }
        return warmup, {t.name: _string_file([WARMUP_TEXT]) for t in inputs}

    def tokenize_parameters(self) -> dict[str, object]:
        parameters: dict[str, object] = {
            "tokenizer_file": self.m.tokenizer_file,
            "max_length": self.m.max_length,
            "truncation_side": "right",
            "pair_truncation": self.m.pair_truncation,
            "pad_id": self.m.pad_id,
        }
        if self.buckets:
            parameters["length_buckets"] = ",".join(map(str, self.buckets))
        if self.m.strip_texts:  # the gateway reads it here too (`contract.STRIP_TEXTS`)
            parameters[contract.STRIP_TEXTS] = "true"
        # an LLM reranker: the stage and the gateway build its prompt the same way
        if self.m.pair_template:
            parameters.update(
                {f"pair_{field}": value for field, value in self.m.pair_template.items()}
            )
        return parameters

    def encode_parameters(self) -> dict[str, object]:
        if self.options.max_batch_tokens < self.m.max_length:
            raise ValueError(
                f"max_batch_tokens {self.options.max_batch_tokens} < max length {self.m.max_length}: "
                "a full-length text would never fit a sub-batch"
            )
        parameters: dict[str, object] = {
            "onnx_file": self.m.onnx_file,
            "max_batch_tokens": encoder_token_budget(self.m, self.options),
            "max_rows": encoder_rows(self.m, self.options),
            "pad_id": self.m.pad_id,
            "intra_op_threads": self.options.cpu_threads,
            "execution_provider": self.options.execution_provider,
            "allow_spinning": str(self.options.encode_instances == 1).lower(),
            "per_token_outputs": ",".join(o.name for o in self.m.outputs if o.per_token),
        }
        # with the served max length, `prensa deploy k8s` sizes the encoder's memory
        if self.m.attention_heads:
            parameters["attention_heads"] = self.m.attention_heads
        # on a live GPU: few fixed shapes, no length-ratio cut
        if self.options.execution_provider == "cuda":
            # (the stage's GpuBatching; its CPU fallback cuts)
            parameters["max_length"] = self.m.max_length
            if packed := self.packed_graph():
                parameters["packed_onnx_file"] = packed
        else:
            parameters["length_ratio"] = self.options.length_ratio
        return parameters

    def served_parameters(self) -> dict[str, object]:
        """Read by the gateway and by tritonclient users (`get_model_config`) on the model clients call.
        `prompts` (a JSON object, name -> text) and `default_prompt_name` appear only when the model has them,
        `include_prompt` only when it is false, `matryoshka_dimensions` only when the model declares some."""
        m = self.m
        parameters: dict[str, object] = {
            "task": m.task.value,
            "source": m.source,
            "revision": m.revision,
            "max_length": m.max_length,
            "pooling": m.graph_pooling or (self.options.pooling or m.pooling or Pooling.CLS).value,
            "dtype": m.tensorrt.precision if self.native_encoder and m.tensorrt else m.dtype,
            "normalize": str(m.normalize).lower(),
            "id2label": ",".join(m.id2label[i] for i in sorted(m.id2label)),
            "pipeline": self.options.pipeline.value,
        }
        if m.prompts:
            parameters["prompts"] = json.dumps(m.prompts, sort_keys=True)
        if m.default_prompt_name:
            parameters["default_prompt_name"] = m.default_prompt_name
        if not m.include_prompt:
            parameters["include_prompt"] = "false"
        if m.matryoshka_dimensions is not None:  # "" for any size
            parameters["matryoshka_dimensions"] = ",".join(map(str, m.matryoshka_dimensions))
        if m.late_interaction:  # how the gateway frames queries (`LateInteraction`)
            parameters["late_interaction"] = json.dumps(asdict(m.late_interaction), sort_keys=True)
        return parameters

    def served_calibration(self) -> Path | None:
        """The export's calibration file when its ranges describe the dense vectors served: they were
        taken with the manifest's pooling, which a `--pooling` override replaces. An export copied
        without the file is served without it, as models without dense vectors are."""
        if (
            not self.m.calibration_file
            or (self.options.pooling or self.m.pooling) is not self.m.pooling
        ):
            return None
        path = self.model.export_dir / self.m.calibration_file
        return path if path.is_file() else None

    def place_tokenizer(self, version: Path) -> None:
        """The tokenizer file, and beside it a late-interaction model's query tokenizer and the
        calibration file (where the gateway looks for them)."""
        link_or_copy(self.model.export_dir / self.m.tokenizer_file, version / self.m.tokenizer_file)
        if late := self.m.late_interaction:
            query = late.query_tokenizer_file
            link_or_copy(self.model.export_dir / query, version / query)
        calibration = self.served_calibration()
        if calibration:
            link_or_copy(calibration, version / CALIBRATION_FILE)

    def tokenize(self) -> None:
        inputs = self.text_inputs()
        warmup, files = self._text_warmup(inputs)
        config = _python_stage(
            self.stage_dir("tokenize").name,
            self.options,
            inputs,
            [Tensor(n, contract.triton_type(n), [-1]) for n in TOKEN_INPUTS],
            self.tokenize_parameters(),
            warmup,
        )
        self._write(self.stage_dir("tokenize"), config, "tokenize", files)
        self.place_tokenizer(self.stage_dir("tokenize") / "1")

    def encode(self) -> None:
        if self.native_encoder:
            self.native_encode()
            return
        warmup, files = self._token_warmup(TOKEN_INPUTS)
        config = _python_stage(
            self.stage_dir("encode").name,
            self.options,
            [Tensor(n, contract.triton_type(n), [-1], ragged=True) for n in TOKEN_INPUTS],
            [Tensor(o.name, ENCODER_OUTPUT, o.dims) for o in self.m.outputs],
            self.encode_parameters(),
            warmup,
            instances=self.options.encode_instances,
            max_batch_size=encoder_window(self.options),
        )
        self._write(self.stage_dir("encode"), config, "encode", files)
        self.place_graphs(self.stage_dir("encode") / "1")

    def packed_graph(self) -> str | None:
        """The export's packed graph where the Python-backend encoder runs on CUDA, its only provider."""
        return self.m.packed_file if self.options.execution_provider == "cuda" else None

    def place_graphs(self, version: Path) -> None:
        """The graph a Python-backend encoder runs, and on CUDA the packed one, with their weights."""
        for graph in (self.m.onnx_file, self.packed_graph()):
            if graph is not None:
                link_graph_files(self.model.export_dir, version, graph)

    def native_encode(self) -> None:
        warmup, files = self._bucket_warmup(tuple(self.encoder_inputs()))
        directory = self.stage_dir("encode")
        options = self.options
        cache = f"{options.trt_cache_dir}/{directory.name}" if options.onnx_tensorrt else None
        config = native.encoder_config(
            directory.name,
            self.m,
            options.max_batch_size,
            options.queue_delay_us,
            options.max_queue_size,
            self.options.encode_instances,
            warmup,
            cache,
        )
        self._write(directory, config, None, files)
        if self.m.tensorrt:
            link_or_copy(
                self.model.export_dir / self.m.tensorrt.file, directory / "1" / self.m.tensorrt.file
            )
        else:
            graph = native.served_graph(self.m, options.onnx_tensorrt)
            link_graph_files(self.model.export_dir, directory / "1", graph)

    def pool(self) -> None:
        warmup, files = self._token_warmup((contract.INPUT_IDS, contract.ATTENTION_MASK))
        length = int(self.sample_tokens[contract.INPUT_IDS].shape[0])
        for o in self.m.outputs:
            dims = [length, *o.dims[1:]] if o.per_token else o.dims
            warmup[o.name] = {"data_type": ENCODER_OUTPUT, "dims": dims, "zero_data": True}
        config = _python_stage(
            self.stage_dir("pool").name,
            self.options,
            [
                *(
                    Tensor(n, contract.triton_type(n), [-1], ragged=True)
                    for n in (contract.INPUT_IDS, contract.ATTENTION_MASK)
                ),
                *(Tensor(o.name, ENCODER_OUTPUT, o.dims, ragged=True) for o in self.m.outputs),
            ],
            client_outputs(self.m),
            pool_parameters(self.m, self.options),
            warmup,
        )
        self._write(self.stage_dir("pool"), config, "pool", files)

    def ensemble(self) -> None:
        encoder_inputs = self.encoder_inputs()
        used = [
            n
            for n in TOKEN_INPUTS
            if n in encoder_inputs or n in (contract.INPUT_IDS, contract.ATTENTION_MASK)
        ]
        tokens = {n: f"tokens_{n}" for n in used}
        encoded = {o.name: f"encoded_{o.name}" for o in self.m.outputs}
        inputs = self.text_inputs()
        outputs = client_outputs(self.m)
        config = {
            "name": self.model.name,
            "platform": "ensemble",
            "max_batch_size": self.options.max_batch_size,
            "input": [t.as_input() for t in inputs],
            "output": [t.as_output() for t in outputs],
            "ensemble_scheduling": {
                "step": [
                    {
                        "model_name": self.stage_dir("tokenize").name,
                        "model_version": -1,
                        "input_map": {t.name: t.name for t in inputs},
                        "output_map": tokens,
                    },
                    {
                        "model_name": self.stage_dir("encode").name,
                        "model_version": -1,
                        "input_map": {n: tokens[n] for n in encoder_inputs},
                        "output_map": encoded,
                    },
                    {
                        "model_name": self.stage_dir("pool").name,
                        "model_version": -1,
                        "input_map": {
                            contract.INPUT_IDS: tokens[contract.INPUT_IDS],
                            contract.ATTENTION_MASK: tokens[contract.ATTENTION_MASK],
                            **encoded,
                        },
                        "output_map": {t.name: t.name for t in outputs},
                    },
                ]
            },
            "parameters": string_parameters(self.served_parameters()),
        }
        if (
            self.options.response_cache
            and cache_refusal(self.m.task, self.options.pipeline) is None
        ):
            # Looked up per request before the ensemble schedules a step: a hit skips all three stages.
            config["response_cache"] = {"enable": True}
        self._write(self.repo / self.model.name, config, None)

    def fused(self) -> None:
        """`<name>` as one Python model: the ensemble's inputs and outputs, plus token-id inputs and the
        encoder's own outputs (`contract.ENCODER_ONLY`: the gateway's token path, which otherwise calls
        the stages)."""
        text_inputs = self.text_inputs(optional=True)  # a request sends texts or token ids
        encoder_only = [
            Tensor(o.name, ENCODER_OUTPUT, o.dims)
            for o in self.m.outputs
            if o.name in contract.ENCODER_ONLY
        ]
        warmup, files = self._text_warmup(text_inputs)
        # the pool stage's `pooling` is what runs
        parameters = {
            **self.served_parameters(),
            **self.tokenize_parameters(),
            **self.encode_parameters(),
            **pool_parameters(self.m, self.options),
        }
        config = _python_stage(
            self.model.name,
            self.options,
            [
                *text_inputs,
                *(
                    Tensor(n, contract.triton_type(n), [-1], optional=True, ragged=True)
                    for n in TOKEN_INPUTS
                ),
            ],
            [*client_outputs(self.m), *encoder_only],
            parameters,
            warmup,
            instances=self.options.encode_instances,
        )
        directory = self.repo / self.model.name
        self._write(directory, config, "fused", files)
        for stage in PIPELINE_STAGES:
            shutil.copy2(
                stage_model_file(stage), directory / "1" / f"{stage_module_name(stage)}.py"
            )
        self.place_tokenizer(directory / "1")
        self.place_graphs(directory / "1")

    def all_dirs(self) -> list[Path]:
        """Every directory either pipeline writes for this model, the model clients call first."""
        return [self.repo / self.model.name, *(self.stage_dir(s) for s in PIPELINE_STAGES)]

    def model_dirs(self) -> list[Path]:
        """What `render` writes, the model clients call first."""
        return self.all_dirs()[:1] if self.options.pipeline is Pipeline.FUSED else self.all_dirs()

    def render(self) -> None:
        if self.options.pipeline is Pipeline.FUSED:
            self.fused()
            return
        self.tokenize()
        self.encode()
        self.pool()
        self.ensemble()


# The options a repository was last built with, beside its models (Triton reads directories only):
# a model added to the running server (`triton.models`) is rendered with them.
SERVING_RECORD = "prensa-serving.json"
# ServingOptions' fields whose JSON value is read back into a type of its own
TYPED_FIELDS: dict[str, Any] = {
    "pooling": lambda value: Pooling(value) if value else None,
    "target": Target,
    "pipeline": Pipeline,
    "length_buckets": tuple,
}


def write_serving_record(repo: Path, options: ServingOptions) -> None:
    (repo / SERVING_RECORD).write_text(json.dumps(asdict(options), indent=2) + "\n")


def read_serving_record(repo: Path) -> ServingOptions:
    """The options `repo` was last built with; the defaults where it says none (an older prensa's)."""
    path = repo / SERVING_RECORD
    if not path.is_file():
        return ServingOptions()
    known = {field.name for field in fields(ServingOptions)}
    saved = {name: value for name, value in json.loads(path.read_text()).items() if name in known}
    return ServingOptions(
        **{name: TYPED_FIELDS.get(name, lambda v: v)(value) for name, value in saved.items()}
    )


def build_repository(models: list[ModelSource], repo: Path, options: ServingOptions) -> list[str]:
    """Render every model into `repo`; returns the names of the models written (ensembles first)."""
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    if options.pipeline is Pipeline.FUSED and options.target is not Target.CPU:
        raise ValueError(
            "the fused pipeline runs onnxruntime in the Python backend: use it with the cpu target"
        )
    for model in models:  # a graph missing its weights is named here, before anything is written
        # an engine replaces the graph
        if not (options.target is Target.CONTAINER and model.manifest.tensorrt):
            graph_data_files(model.export_dir / model.manifest.onnx_file)
        if options.pooling and model.manifest.graph_pooling:
            raise ValueError(
                f"{model.name} pools inside its graph with its own sentence-transformers modules "
                f"({model.manifest.graph_pooling}, then any Dense layers): --pooling cannot change it"
            )
    repo.mkdir(parents=True, exist_ok=True)
    written = []
    for model in models:
        renderer = ModelRenderer(model, repo, options)
        for directory in renderer.all_dirs():
            # a rebuild may switch pipelines: no stale stages
            shutil.rmtree(directory, ignore_errors=True)
        renderer.render()
        written += [directory.name for directory in renderer.model_dirs()]
    write_serving_record(repo, options)
    return written


def encode_stage_config(
    export_dir: Path, manifest: Manifest, options: ServingOptions
) -> dict[str, Any]:
    """The encode stage's model config as `build_repository` writes it (its batch size and
    parameters, as Triton hands them to the stage): for running the stage outside Triton on an
    export, as the GPU benchmark does."""
    renderer = ModelRenderer(
        ModelSource("encode", export_dir, manifest), export_dir.parent, options
    )
    return {
        "max_batch_size": encoder_window(options),
        "parameters": string_parameters(renderer.encode_parameters()),
    }
