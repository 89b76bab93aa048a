"""`InProcessBackend`: the gateway's `Backend` over a rendered model repository, with no Triton.

The repository is the one `prensa serve` gives Triton (`prensa.triton.repo.build_repository`);
`prensa.triton.inprocess.ModelRepository` runs it in this process: every model's
`config.pbtxt` read with Triton's protobuf, every model reported READY once loaded, prensa's own
stage code run on onnxruntime for ensembles (step by step, following their tensor maps), fused
models and the direct `<name>_encode` / `<name>_pool` calls of the gateway's token path. What a
stage or Triton's checks would refuse becomes the `GatewayError` Triton's answer becomes
(`backends.triton.translate_error`): a stage's own error is Backend (424).

For tests of the HTTP contract (`tests/fast`) and for machines without Triton:
`create_app(settings, backend=InProcessBackend.from_settings)`, `settings.repo` the repository.
Calls run in threads, each model one `execute` at a time, as one Triton instance of it would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt
from opentelemetry.trace import SpanKind
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from prensa.gateway.backends.base import READY
from prensa.gateway.backends.triton import translate_error
from prensa.gateway.errors import GatewayError
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.tracing import model_call
from prensa.triton.inprocess import ModelError, ModelRepository


class InProcessBackend:
    """A `prensa.gateway.backends.base.Backend` running `repo` in this process (see the module docstring)."""

    replica_count = 1

    def __init__(self, repo: Path, timeout_s: float = 30.0) -> None:
        self.repo = Path(repo)
        self.timeout_s = timeout_s
        self.repository = ModelRepository(self.repo)

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> InProcessBackend:
        """The factory `create_app(backend=...)` takes: `settings.repo`, `settings.triton_timeout_s`."""
        return cls(settings.repo, settings.triton_timeout_s)

    @property
    def url(self) -> str:
        return f"in-process:{self.repo}"

    def _error(self, error: ModelError) -> GatewayError:
        """The error Triton's answer of the same message and status becomes."""
        return translate_error(
            InferenceServerException(error.message, status=error.status), self.url, self.timeout_s
        )

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
        request_id: str = "",
    ) -> dict[str, npt.NDArray[Any]]:
        with model_call(f"in-process {model}", model, inputs, SpanKind.INTERNAL):
            try:  # past the deadline the caller is answered at once; the thread finishes its call unobserved
                return await asyncio.wait_for(
                    asyncio.to_thread(self.repository.infer, model, dict(inputs), list(outputs)),
                    self.timeout_s,
                )
            except ModelError as exc:
                raise self._error(exc) from None
            except TimeoutError:
                raise self._error(
                    ModelError(
                        f"{model} did not answer within {self.timeout_s:g} s",
                        "StatusCode.DEADLINE_EXCEEDED",
                    )
                ) from None

    async def model_states(self) -> dict[str, tuple[str, str]]:
        return dict(self.repository.states)

    async def config(self, model: str) -> model_config_pb2.ModelConfig:
        try:
            return self.repository.config(model)
        except ModelError as exc:
            raise self._error(exc) from None

    async def unready(self, models: Sequence[str]) -> list[str] | None:
        states = self.repository.states
        return [m for m in models if states.get(m, ("",))[0] != READY]

    def start_probing(self, models: Callable[[], Sequence[str]]) -> None:
        """Nothing to probe: the models live and die with this process."""

    async def close(self) -> None:
        await asyncio.to_thread(self.repository.close)
