"""A rendered model repository run in this process, the way Triton runs it, without Triton.

Each Python-backend model's `TritonPythonModel` (the stage code of `prensa.stages`, not the copy
in the repository) is initialised with the arguments Triton gives it (its `config.pbtxt` as
JSON, its directory and version) and executed on requests through `StageUtils`, a stand-in for
`triton_python_backend_utils`. Ensembles follow their `ensemble_scheduling` steps and tensor
maps; every request of one call goes through each step in one `execute`, as Triton's dynamic
batcher would merge them. Triton's own checks before a model runs (known model, input and output
names, required inputs, batch size) are made here too, with Triton's wording.

Failures are `ModelError`s carrying the message Triton would send (a stage's own error
response, or an exception out of `execute`) and a gRPC status name, so callers translate them
as they translate Triton's (`prensa.gateway.backends.triton.translate_error`). Native encoders
(TensorRT, the onnxruntime backend: the `container` target) are not run: such a model is listed
UNAVAILABLE with the reason.

Used by the gateway's `InProcessBackend` (the fast tests' gateway, `prensa bench gateway`); not
thread-safe across `ModelRepository` objects sharing a model directory,
but safe to call from many threads: each model runs one `execute` at a time, as one Triton
instance does.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from prensa.stages import PIPELINE_STAGES, load_stage, stage_module_name, stage_of_model
from prensa.triton.config import config_parameters, parse_pbtxt

log = logging.getLogger("prensa.inprocess")
CONFIG_FILE = "config.pbtxt"
FUSED = "fused"
# gRPC status names as tritonclient reports them (`InferenceServerException.status()`).
INTERNAL, INVALID_ARGUMENT, NOT_FOUND, CANCELLED, DOWN = (
    f"StatusCode.{s}"
    for s in ("INTERNAL", "INVALID_ARGUMENT", "NOT_FOUND", "CANCELLED", "UNAVAILABLE")
)
READY, UNAVAILABLE = "READY", "UNAVAILABLE"


class ModelError(Exception):
    """What Triton would answer instead of outputs: its message and gRPC status."""

    def __init__(self, message: str, status: str = INTERNAL) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class StageUtils:
    """The slice of `triton_python_backend_utils` prensa's stages use, over plain numpy."""

    class Tensor:
        def __init__(self, name: str, value: npt.NDArray[Any]) -> None:
            self._name, self._value = name, value

        def name(self) -> str:
            return self._name

        def as_numpy(self) -> npt.NDArray[Any]:
            return self._value

    class TritonError:
        (
            UNKNOWN,
            INTERNAL,
            NOT_FOUND,
            INVALID_ARG,
            UNAVAILABLE,
            UNSUPPORTED,
            ALREADY_EXISTS,
            CANCELLED,
        ) = range(8)

        def __init__(self, message: str, code: int = 1) -> None:
            self._message, self._code = message, code

        def message(self) -> str:
            return self._message

        def code(self) -> int:
            return self._code

    class InferenceResponse:
        def __init__(self, output_tensors: list[Any] | None = None, error: Any = None) -> None:
            self._outputs, self._error = list(output_tensors or []), error

        def output_tensors(self) -> list[Any]:
            return self._outputs

        def has_error(self) -> bool:
            return self._error is not None

        def error(self) -> Any:
            return self._error

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = range(3)

        def __init__(self, name: str, description: str, kind: int) -> None:
            self.name, self.description, self.kind = name, description, kind

        def Metric(self, labels: dict[str, str] | None = None) -> StageUtils.Metric:  # noqa: N802 - pb_utils' name
            return StageUtils.Metric()

    class Metric:
        def __init__(self) -> None:
            self.total = 0.0

        def increment(self, value: float) -> None:
            self.total += value

        def set(self, value: float) -> None:
            self.total = value

        def value(self) -> float:
            return self.total

    class Logger:
        @staticmethod
        def log_info(message: str) -> None:
            log.info(message)

        @staticmethod
        def log_warn(message: str) -> None:
            log.warning(message)

        @staticmethod
        def log_error(message: str) -> None:
            log.error(message)

        @staticmethod
        def log_verbose(message: str) -> None:
            log.debug(message)

    @staticmethod
    def get_input_tensor_by_name(request: StageRequest, name: str) -> StageUtils.Tensor | None:
        value = request.inputs.get(name)
        return None if value is None else StageUtils.Tensor(name, value)


def load_stage_code(stage: str) -> ModuleType:
    """`prensa.stages.load_stage(stage)` with `StageUtils` where its code (and its siblings') expects
    `triton_python_backend_utils`; the pure functions the gateway and tests call are unchanged."""
    module = load_stage(stage)
    names = [
        "prensa_stage",
        stage_module_name(stage),
        *(stage_module_name(s) for s in PIPELINE_STAGES if stage == FUSED),
    ]
    for name in names:
        if getattr(sys.modules[name], "pb_utils", None) is None:
            setattr(sys.modules[name], "pb_utils", StageUtils)  # noqa: B010 - ModuleType declares no pb_utils
    return module


@dataclass
class StageRequest:
    """One inference request as a stage's `execute` sees it."""

    inputs: Mapping[str, npt.NDArray[Any]]
    outputs: Sequence[str]

    def requested_output_names(self) -> list[str]:
        return list(self.outputs)

    def is_cancelled(self) -> bool:
        return False


def read_config(directory: Path) -> model_config_pb2.ModelConfig:
    """A model's `config.pbtxt` as Triton's protobuf; its name defaults to the directory's, as in Triton."""
    config = parse_pbtxt((directory / CONFIG_FILE).read_text())
    if not config.name:
        config.name = directory.name
    return config


def config_json(config: model_config_pb2.ModelConfig) -> str:
    """The config as Triton hands it to a Python model (`args["model_config"]`): every field, empty
    strings included (a parameter whose value is "" still has its `string_value`)."""
    return json_format.MessageToJson(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def latest_version(directory: Path) -> str:
    versions = sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise ModelError(f"no version directory in {directory.name}")
    return str(versions[-1])


def stage_of(config: model_config_pb2.ModelConfig) -> str | None:
    """Which prensa stage a Python-backend model runs: the fused model says so, stages by their suffix."""
    if config_parameters(config).get("pipeline") == FUSED and "task" in config_parameters(config):
        return FUSED
    return stage_of_model(config.name)


Outcome = dict[str, npt.NDArray[Any]] | ModelError


@dataclass
class PythonModel:
    """One Python-backend model of the repository, one instance: one `execute` at a time."""

    config: model_config_pb2.ModelConfig
    directory: Path
    stage: str
    instance: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self) -> None:
        model = load_stage_code(self.stage).TritonPythonModel()
        model.initialize(
            {
                "model_config": config_json(self.config),
                "model_name": self.config.name,
                "model_repository": str(self.directory),
                "model_version": latest_version(self.directory),
                "model_instance_kind": "CPU",
                "model_instance_name": f"{self.config.name}_0",
                "model_instance_device_id": "0",
            }
        )
        self.instance = model

    def execute(self, requests: list[StageRequest]) -> list[Outcome]:
        with self.lock:
            try:
                responses = self.instance.execute(requests)
            except Exception as exc:  # noqa: BLE001 - Triton fails every request of the batch with it
                return [
                    ModelError(
                        f"Failed to process the request(s) for model '{self.config.name}', message: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    for _ in requests
                ]
        return [self._outcome(request, response) for request, response in zip(requests, responses)]

    def _outcome(self, request: StageRequest, response: StageUtils.InferenceResponse) -> Outcome:
        if response.has_error():
            error = response.error()
            status = CANCELLED if error.code() == StageUtils.TritonError.CANCELLED else INTERNAL
            return ModelError(error.message(), status)
        values = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        missing = [name for name in request.outputs if name not in values]
        if missing:
            return ModelError(f"model '{self.config.name}' did not return output '{missing[0]}'")
        return {name: values[name] for name in request.outputs}

    def finalize(self) -> None:
        if self.instance is not None and hasattr(self.instance, "finalize"):
            self.instance.finalize()
        self.instance = None


class ModelRepository:
    """Every model of a rendered repository, loaded at once (as Triton's `--model-control-mode none`)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.configs: dict[str, model_config_pb2.ModelConfig] = {}
        self.states: dict[str, tuple[str, str]] = {}
        self.python: dict[str, PythonModel] = {}
        for directory in sorted(p for p in self.root.iterdir() if (p / CONFIG_FILE).is_file()):
            try:
                config = read_config(directory)
            except Exception as exc:  # noqa: BLE001 - one bad config must not hide the others
                self.states[directory.name] = (UNAVAILABLE, f"cannot read {CONFIG_FILE}: {exc}")
                continue
            self.configs[config.name] = config
            self.states[config.name] = self._load(config, directory)
        for name, config in self.configs.items():  # an ensemble serves only while all its steps do
            if config.platform == "ensemble" and self.states[name][0] == READY:
                down = [
                    s.model_name
                    for s in config.ensemble_scheduling.step
                    if self.states.get(s.model_name, ("",))[0] != READY
                ]
                if down:
                    self.states[name] = (UNAVAILABLE, f"ensemble step {down[0]} is not ready")

    def _load(self, config: model_config_pb2.ModelConfig, directory: Path) -> tuple[str, str]:
        if config.platform == "ensemble":
            return READY, ""
        stage = stage_of(config) if config.backend == "python" else None
        if stage is None:
            return UNAVAILABLE, (
                f"the in-process runner runs prensa's Python stages and ensembles only, not "
                f"{config.backend or config.platform}"
            )
        model = PythonModel(config, directory, stage)
        try:
            model.load()
        except Exception as exc:  # noqa: BLE001 - reported as Triton reports a model that failed to load
            return UNAVAILABLE, f"load failed: {type(exc).__name__}: {exc}"
        self.python[config.name] = model
        return READY, ""

    def config(self, name: str) -> model_config_pb2.ModelConfig:
        if name not in self.configs:
            raise ModelError(f"Request for unknown model: '{name}' is not found", NOT_FOUND)
        return self.configs[name]

    def infer(
        self, model: str, inputs: Mapping[str, npt.NDArray[Any]], outputs: Sequence[str]
    ) -> dict[str, npt.NDArray[Any]]:
        """One request; raises its `ModelError`."""
        result = self.infer_many(model, [inputs], outputs)[0]
        if isinstance(result, ModelError):
            raise result
        return result

    def infer_many(
        self, model: str, requests: Sequence[Mapping[str, npt.NDArray[Any]]], outputs: Sequence[str]
    ) -> list[Outcome]:
        """Several requests of `model` at once, each step one `execute` of all of them; each gets
        its outputs or its own error."""
        config = self.config(model)
        if self.states[model][0] != READY:
            raise ModelError(
                f"Request for unknown model: '{model}' has no available versions", DOWN
            )
        checked: list[Outcome | None] = [self._check(config, r, outputs) for r in requests]
        live = [i for i, error in enumerate(checked) if error is None]
        if config.platform == "ensemble":
            results = self._ensemble(config, [requests[i] for i in live], outputs)
        else:
            results = self.python[model].execute([StageRequest(requests[i], outputs) for i in live])
        for index, result in zip(live, results):
            checked[index] = result
        return cast(list[Outcome], checked)  # every slot is filled

    def _ensemble(
        self,
        config: model_config_pb2.ModelConfig,
        requests: list[Mapping[str, npt.NDArray[Any]]],
        outputs: Sequence[str],
    ) -> list[Outcome]:
        tensors: list[dict[str, npt.NDArray[Any]] | ModelError] = [dict(r) for r in requests]
        for step in config.ensemble_scheduling.step:
            live = [i for i, t in enumerate(tensors) if not isinstance(t, ModelError)]
            if not live:
                break
            inputs = []
            for i in live:
                current = tensors[i]
                # live holds only the requests not failed
                assert not isinstance(current, ModelError)
                inputs.append(
                    {
                        name: current[source]
                        for name, source in step.input_map.items()
                        if source in current
                    }
                )
            results = self.infer_many(step.model_name, inputs, list(step.output_map))
            for index, result in zip(live, results):
                if isinstance(result, ModelError):  # Triton's ensemble scheduler names the ensemble
                    tensors[index] = ModelError(
                        f"in ensemble '{config.name}', {result.message}", result.status
                    )
                else:
                    current = tensors[index]
                    # live holds only the requests not failed
                    assert not isinstance(current, ModelError)
                    current.update({step.output_map[name]: value for name, value in result.items()})
        return [
            t if isinstance(t, ModelError) else {name: t[name] for name in outputs} for t in tensors
        ]

    @staticmethod
    def _check(
        config: model_config_pb2.ModelConfig,
        inputs: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
    ) -> ModelError | None:
        """Triton's checks before a request reaches a model."""
        name = config.name
        declared = {i.name: i for i in config.input}
        for given in inputs:
            if given not in declared:
                return ModelError(
                    f"unexpected inference input '{given}' for model '{name}'", INVALID_ARGUMENT
                )
        for wanted in declared.values():
            if not wanted.optional and wanted.name not in inputs:
                return ModelError(
                    f"expected {len(declared)} inputs but got {len(inputs)} inputs for model '{name}'. "
                    f"Got input(s) {sorted(inputs)}, but missing required input(s) "
                    f"['{wanted.name}']",
                    INVALID_ARGUMENT,
                )
        known = {o.name for o in config.output}
        for wanted_output in outputs:
            if wanted_output not in known:
                return ModelError(
                    f"unexpected inference output '{wanted_output}' for model '{name}'",
                    INVALID_ARGUMENT,
                )
        rows = {int(np.shape(value)[0]) for value in inputs.values() if np.ndim(value)}
        if config.max_batch_size and any(r > config.max_batch_size for r in rows):
            return ModelError(
                f"inference request batch-size must be <= {config.max_batch_size} for '{name}'",
                INVALID_ARGUMENT,
            )
        return None

    def close(self) -> None:
        for model in self.python.values():
            model.finalize()
        self.python.clear()
