"""Where a corpus's embeddings come from: a running prensa Triton over gRPC, or an export run in
this process by the very stage code Triton runs (tokenize -> encode -> pool, with the parameters
`prensa repo build` writes into their configs), so both give the vectors the server gives.

Both answer in the ensemble's own tensors (`dense`, `sparse_ids`, ...), one response per request
of at most `max_rows` texts; `prensa.corpus.io` turns them into Parquet columns.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy.typing as npt
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from prensa.corpus import HEAL_WAIT_S
from prensa.layouts import LAYOUTS
from prensa.manifest import Manifest
from prensa.stages import PIPELINE_STAGES, contract, load_stage
from prensa.tensors import texts_tensor
from prensa.triton.config import config_parameters
from prensa.triton.repo import (
    ServingOptions,
    client_outputs,
    encoder_rows,
    encoder_token_budget,
    pool_parameters,
    served_pipeline,
)

# A request sent again while the server heals: first after this long, then twice as long each time.
HEAL_POLL_S = 0.5
HEAL_POLL_MAX_S = 5.0
UNREACHABLE = "StatusCode.UNAVAILABLE"  # tritonclient's status for a server it cannot reach
# output kinds a corpus run can ask for, and the ensemble outputs each needs
KINDS = contract.OUTPUT_KINDS
# the layouts whose answers are a text's embedding, dense or sparse (a late model's are per token)
EMBEDDING_TASKS = tuple(
    layout.task.value
    for layout in LAYOUTS
    if layout.answers & {contract.DENSE, contract.SPARSE_IDS}
)


class BackendError(RuntimeError):
    """The model cannot embed this corpus, or the server failed; the message says which."""


@dataclass(frozen=True)
class ModelInfo:
    """What identifies the vectors (recorded beside the parts) and how to call the model."""

    name: str
    source: str
    revision: str
    dtype: str
    max_length: int
    kinds: tuple[str, ...]  # output kinds the model has, in KINDS order
    max_rows: int  # texts per request

    def choose(self, requested: str | None) -> tuple[str, ...]:
        """Requested kinds (comma-separated), checked; by default every kind but ColBERT, whose
        token x dim floats per row are worth asking for explicitly."""
        if requested is None:
            return tuple(k for k in self.kinds if k != "colbert")
        wanted = [k.strip() for k in requested.split(",") if k.strip()]
        unknown = [k for k in wanted if k not in self.kinds]
        if unknown or not wanted:
            raise BackendError(
                f"{self.name} offers outputs {', '.join(self.kinds)}; asked for {requested!r}"
            )
        return tuple(k for k in self.kinds if k in wanted)


def kinds_of(output_names: set[str]) -> tuple[str, ...]:
    return tuple(kind for kind, names in KINDS.items() if set(names) <= output_names)


def requested_outputs(kinds: tuple[str, ...]) -> list[str]:
    return [name for kind in kinds for name in KINDS[kind]] + [contract.NUM_TOKENS]


def _chunks(texts: list[str], size: int) -> list[list[str]]:
    return [texts[start : start + size] for start in range(0, len(texts), size)]


def _rows(batch_size: int, limit: int, name: str) -> int:
    if batch_size > limit:
        raise BackendError(f"--batch-size {batch_size} exceeds {name}'s max_batch_size {limit}")
    return batch_size or limit


class EmbeddingBackend(Protocol):
    """What `embed-corpus` reads vectors from, a text slice at a time and synchronously (Ray's
    workers and the local runner's threads call it); the gateway's `Backend` is a different seam,
    one Triton call of tensors, awaited."""

    info: ModelInfo

    def embed(self, texts: list[str], kinds: tuple[str, ...]) -> list[dict[str, npt.NDArray[Any]]]:
        """Responses for consecutive slices of `texts`, in order."""

    def close(self) -> None: ...


class TritonBackend:
    """A prensa ensemble or fused model over gRPC, several requests in flight so Triton's batcher has work to merge."""

    def __init__(
        self, url: str, model: str, batch_size: int, concurrency: int, heal_wait_s: float
    ) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.heal_wait_s = heal_wait_s
        try:
            config = self.client.get_model_config(model).config
        except InferenceServerException as exc:
            raise BackendError(f"cannot read {model!r} from Triton at {url}: {exc}") from exc
        params = config_parameters(config)
        if served_pipeline(config) is None or params.get("task") not in EMBEDDING_TASKS:
            raise BackendError(
                f"{model!r} is not a prensa embedding model (task {params.get('task')!r}); "
                f"embed-corpus takes {', '.join(EMBEDDING_TASKS)} models"
            )
        self.info = ModelInfo(
            model,
            params.get("source", ""),
            params.get("revision", ""),
            params.get("dtype", ""),
            int(params.get("max_length", "0")),
            kinds_of({output.name for output in config.output}),
            _rows(batch_size, config.max_batch_size or 1, model),
        )
        self.pool = ThreadPoolExecutor(max(concurrency, 1))

    def _infer(self, texts: list[str], names: list[str]) -> dict[str, npt.NDArray[Any]]:
        """One request, sent again while the server heals (restarting, or reloading the model)
        for at most `heal_wait_s`; a request the ready model fails is the job's failure."""
        tensor = grpcclient.InferInput(contract.TEXT, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(texts_tensor(texts))
        outputs = [grpcclient.InferRequestedOutput(name) for name in names]
        deadline = time.monotonic() + self.heal_wait_s
        pause = HEAL_POLL_S
        while True:
            try:
                result = self.client.infer(self.info.name, [tensor], outputs=outputs)
                return {name: result.as_numpy(name) for name in names}
            except InferenceServerException as exc:
                healing = self._healing(exc)
                if not healing or time.monotonic() + pause > deadline:
                    waited = f" (waited {self.heal_wait_s:.0f} s for it to heal)" if healing else ""
                    raise BackendError(
                        f"Triton failed a request of {len(texts)} texts{waited}: {exc}"
                    ) from exc
            time.sleep(pause)
            pause = min(pause * 2, HEAL_POLL_MAX_S)

    def _healing(self, failure: InferenceServerException) -> bool:
        """The server is out of reach, or the model is not ready: `prensa serve` restarts a dead
        Triton and reloads a crashed stage, so the request is worth sending again."""
        if failure.status() == UNREACHABLE:
            return True
        try:
            return not self.client.is_model_ready(self.info.name)
        except InferenceServerException:
            return True

    def embed(self, texts: list[str], kinds: tuple[str, ...]) -> list[dict[str, npt.NDArray[Any]]]:
        names = requested_outputs(kinds)
        return list(
            self.pool.map(
                lambda chunk: self._infer(chunk, names), _chunks(texts, self.info.max_rows)
            )
        )

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


def export_info(export_dir: Path, manifest: Manifest, batch_size: int) -> ModelInfo:
    if manifest.task.value not in EMBEDDING_TASKS:
        raise BackendError(
            f"{export_dir} is a {manifest.task.value} model; embed-corpus takes "
            f"{', '.join(EMBEDDING_TASKS)} models"
        )
    return ModelInfo(
        export_dir.resolve().name,
        manifest.source,
        manifest.revision,
        manifest.dtype,
        manifest.max_length,
        kinds_of({t.name for t in client_outputs(manifest)}),
        _rows(batch_size, ServingOptions().max_batch_size, "the default repository"),
    )


class OnnxBackend:
    """The served pipeline in this process: the stages' own functions and classes, with the
    parameters a default `prensa repo build` writes into their configs. All texts of one call go
    through the token-budget encoder together, length-sorted across requests."""

    def __init__(self, export_dir: Path, batch_size: int, threads: int) -> None:
        manifest = Manifest.read(export_dir)
        self.info = export_info(export_dir, manifest, batch_size)
        options = ServingOptions()
        tokenize, encode, pool = (load_stage(stage) for stage in PIPELINE_STAGES)
        # The tokenize stage's config: right truncation (a corpus has single texts, no pairs).
        self.tokenizer = tokenize.TextEncoder(
            export_dir / manifest.tokenizer_file, manifest.max_length, strip=manifest.strip_texts
        )
        self.pad, self.pad_id = tokenize.pad_encodings, manifest.pad_id
        session = encode.create_session(
            export_dir / manifest.onnx_file, threads, options.execution_provider
        )
        self.encoder = encode.TokenBudgetEncoder(
            session,
            manifest.pad_id,
            encoder_token_budget(manifest, options),
            options.length_ratio,
            encoder_rows(manifest, options),
            {output.name for output in manifest.outputs if output.per_token},
        )
        self.pool = pool.Pooler.from_parameters(pool_parameters(manifest, options))

    def embed(self, texts: list[str], kinds: tuple[str, ...]) -> list[dict[str, npt.NDArray[Any]]]:
        encoded = self.tokenizer.encode_requests(_chunks(texts, self.info.max_rows))
        failed = next((result for result in encoded if isinstance(result, Exception)), None)
        if failed is not None:
            raise BackendError(f"the tokenizer failed: {failed}")
        tokens = [self.pad(encodings, self.pad_id) for encodings in encoded]
        names = requested_outputs(kinds)
        responses = []
        for request, outputs in zip(tokens, self.encoder.encode(tokens)):
            stage_inputs = {
                contract.INPUT_IDS: request[contract.INPUT_IDS],
                contract.ATTENTION_MASK: request[contract.ATTENTION_MASK],
                **outputs,
            }
            pooled = self.pool(stage_inputs)
            responses.append({name: pooled[name] for name in names})
        return responses

    def close(self) -> None:
        """Free the onnxruntime session (a large graph's memory) now rather than when the object goes."""
        del self.encoder


@dataclass(frozen=True)
class BackendSpec:
    """Where to embed, as plain values: Ray sends it to each worker, which opens its own backend."""

    triton_url: str | None = None
    model: str | None = None
    export_dir: Path | None = None
    batch_size: int = 0  # texts per request; 0 = the model's max_batch_size
    concurrency: int = 4  # Triton requests in flight per backend
    threads: int = 0  # onnxruntime intra-op threads in-process; 0 = every core
    heal_wait_s: float = HEAL_WAIT_S  # how long a request is sent again while the server heals

    def __post_init__(self) -> None:
        if (self.export_dir is None) == (self.triton_url is None):
            raise BackendError(
                "embed with exactly one of a Triton endpoint (--triton-url, --model) "
                "or an export (--export)"
            )
        if self.triton_url is not None and not self.model:
            raise BackendError("--triton-url needs --model, the ensemble or fused model to call")

    def describe(self) -> ModelInfo:
        """The model's identity and limits without loading it (Ray's driver needs no session)."""
        if self.export_dir is not None:
            return export_info(self.export_dir, Manifest.read(self.export_dir), self.batch_size)
        backend = self.open()
        backend.close()
        return backend.info

    def open(self) -> EmbeddingBackend:
        if self.export_dir is not None:
            return OnnxBackend(self.export_dir, self.batch_size, self.threads)
        assert self.triton_url is not None and self.model is not None
        return TritonBackend(
            self.triton_url, self.model, self.batch_size, self.concurrency, self.heal_wait_s
        )
