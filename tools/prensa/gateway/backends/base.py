"""The one seam between the gateway and what computes its answers (as TEI's `Backend` trait).

Everything the gateway's service, model registry and health routes ask of an inference server:
run a model, list the models and their states, read a model's config, say which models cannot
answer now. `TritonClient` (one Triton over gRPC), `ReplicaPool` (several, health-checked) and
`InProcessBackend` (a rendered model repository run in this process, see `backends.local`)
implement it structurally; `create_app` takes a factory of any of them.

Model configs are Triton's own protobuf (`model_config_pb2.ModelConfig`), whoever serves them, so
the registry reads every backend's models the same way. Errors are `GatewayError`s of the kinds
`backends.triton.translate_error` gives: Unhealthy (503), Overloaded (429), Backend (424).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy.typing as npt
from tritonclient.grpc import model_config_pb2

from prensa.gateway.settings import GatewaySettings

READY = "READY"  # a model's state in the repository index when it can serve


class Backend(Protocol):
    @property
    def url(self) -> str:
        """Where the models are served, for messages (Triton URLs, comma-separated; a repository path)."""
        ...

    @property
    def replica_count(self) -> int:
        """How many copies of each model answer (Triton replicas): the rows an ensemble may have in
        flight scale with it (see `limits.TritonWindow`)."""
        ...

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
        request_id: str = "",
    ) -> dict[str, npt.NDArray[Any]]:
        """`outputs` of `model` for `inputs` (batch on axis 0); a `GatewayError` when it fails."""
        ...

    async def model_states(self) -> dict[str, tuple[str, str]]:
        """Every model in the repository index: its state (READY, LOADING, UNAVAILABLE, ...) and the reason."""
        ...

    async def config(self, model: str) -> model_config_pb2.ModelConfig: ...

    async def unready(self, models: Sequence[str]) -> list[str] | None:
        """Those of `models` that cannot answer now; None while the server itself cannot be reached."""
        ...

    def start_probing(self, models: Callable[[], Sequence[str]]) -> None:
        """Health-check in the background from now on; `models()` (read at each probe) must be ready."""
        ...

    async def close(self) -> None: ...


# called in the app's lifespan, inside its event loop
BackendFactory = Callable[[GatewaySettings], Backend]
