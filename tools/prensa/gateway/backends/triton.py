"""Every call the gateway makes to Triton, over one reused gRPC aio channel.

Triton's gRPC errors become `GatewayError`s here: unreachable or too slow, a stage whose Python
stub died or a model being reloaded (see `prensa.triton.healing`) -> Unhealthy (503), a full
Triton queue -> Overloaded (429), anything else Triton reports -> Backend (424). Without
`wait_for_ready`, gRPC fails at once while the channel cannot connect, so a dead Triton costs a
request milliseconds, not the timeout; the channel retries the connection at least once a second
(gRPC's own backoff grows to two minutes), so a restarted Triton is used again within a second.
Triton's messages reach clients only without the Python backend's traceback and file paths.
A request that met a dead stub is tried once more (`met_a_dead_stub`). A 503 for a stage or a
Triton that is down says when to come back, in its message and in
`Retry-After`: what the model's last outage had left (`Outages`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy.typing as npt
import tritonclient.grpc.aio as grpcaio
from opentelemetry.trace import SpanKind
from tritonclient.grpc import InferInput, InferRequestedOutput, model_config_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from prensa.gateway.backends.base import READY
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.tracing import model_call, triton_headers
from prensa.tensors import texts_tensor

__all__ = ["READY", "TritonClient", "public_message", "texts_tensor", "translate_error"]
T = TypeVar("T")

# Channel options: tritonclient's message size limit (2**31 - 1; passing options replaces its
# defaults) and reconnection attempts at most `RECONNECT_MS` apart.
MAX_MESSAGE_BYTES = 2**31 - 1
RECONNECT_MS = 1000
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MS),
]
# The Python backend appends "At:" and the stack (file paths, line numbers) to an uncaught
# exception's message; anything that still looks like an absolute file path is masked too.
TRACEBACK = re.compile(r"\s*(Traceback \(most recent call last\)|At:\s*\n).*", re.DOTALL)
FILE_PATH = re.compile(r"(?<![\w.:/])(?:/[\w.@+-]+){2,}/?")
# A stage that cannot answer for now: its stub process died, or the model is unloaded for a reload.
STAGE_DOWN = re.compile(
    r"Stub process '(?P<stub>[^']+)' is not healthy|"
    r"unknown model: '(?P<model>[^']+)' has no available versions"
)


# Retry-After of a 503 for a model that was never down before: about what a reload takes.
FIRST_OUTAGE_S = 3.0
MAX_RETRY_AFTER_S = 30


class Outages:
    """When each model Triton could not serve went down, and how long its last outage lasted, so a
    503 says when to come back: what the model's last outage had left from now, at least 1 s."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}  # model -> when its current outage began
        self.lasted: dict[str, float] = {}  # model -> seconds its last outage lasted

    def down(self, model: str) -> int:
        """Seconds to wait before trying `model` again."""
        now = time.monotonic()
        began = self.since.setdefault(model, now)
        left = self.lasted.get(model, FIRST_OUTAGE_S) - (now - began)
        return min(max(1, math.ceil(left)), MAX_RETRY_AFTER_S)

    def up(self, model: str) -> None:
        if (began := self.since.pop(model, None)) is not None:
            self.lasted[model] = time.monotonic() - began


def met_a_dead_stub(exc: InferenceServerException) -> bool:
    """The request reached a stage whose stub had died. Triton says so only after waiting a second
    on the stub, by which time `prensa serve` has usually reloaded the stage: the request is tried
    once more (inference has no side effects), and only a second failure reaches the client."""
    down = STAGE_DOWN.search(exc.message() or "")
    return down is not None and down["stub"] is not None


def public_message(message: str) -> str:
    """Triton's error message without traceback or file paths: fit for a response body."""
    return FILE_PATH.sub("<path>", TRACEBACK.sub("", message)).strip()


def translate_error(
    exc: InferenceServerException,
    url: str,
    timeout_s: float,
    retry_after: Callable[[], int] | None = None,
) -> GatewayError:
    """A tritonclient error as the gateway's error kind (see the module docstring); `retry_after`
    gives the seconds a 503 for a stage or a Triton that is down tells the client to wait."""
    status, message = exc.status() or "", public_message(exc.message() or str(exc))
    if status.endswith("DEADLINE_EXCEEDED"):
        return GatewayError(
            ErrorKind.UNHEALTHY, f"Triton at {url} did not answer within {timeout_s:g} s"
        )
    if "maximum queue size" in message:  # a stage's bounded queue rejected the request
        return GatewayError(ErrorKind.OVERLOADED, "Model is overloaded")
    down = STAGE_DOWN.search(message)
    if down or status.endswith("UNAVAILABLE"):
        wait = retry_after() if retry_after else None
        what = (
            f"Triton's {down['stub'] or down['model']} cannot answer now (its process died, or it is being "
            "reloaded)"
            if down
            else f"Triton is unreachable at {url}"
        )
        return GatewayError(
            ErrorKind.UNHEALTHY, what + (f"; retry in {wait} s" if wait else ""), wait
        )
    return GatewayError(ErrorKind.BACKEND, f"Backend error: {message}")


class TritonClient:
    """One Triton over gRPC; a `prensa.gateway.backends.base.Backend`."""

    replica_count = 1

    def __init__(self, url: str, timeout_s: float, probe_timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._client = grpcaio.InferenceServerClient(url, channel_args=CHANNEL_OPTIONS)
        self.outages = Outages()

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
        request_id: str = "",
    ) -> dict[str, npt.NDArray[Any]]:
        tensors = []
        for name, array in inputs.items():
            tensor = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        with model_call(
            f"triton {model}",
            model,
            inputs,
            SpanKind.CLIENT,
            **{"rpc.system": "grpc", "rpc.method": "ModelInfer", "server.address": self.url},
        ):
            for attempt in (1, 2):
                try:
                    result = await self._client.infer(
                        model,
                        tensors,
                        outputs=[InferRequestedOutput(n) for n in outputs],
                        request_id=request_id,
                        client_timeout=self.timeout_s,
                        headers=triton_headers(),
                    )
                    break
                except InferenceServerException as exc:
                    if attempt == 1 and met_a_dead_stub(exc):
                        continue
                    raise translate_error(
                        exc, self.url, self.timeout_s, lambda: self.outages.down(model)
                    ) from None
        if self.outages.since:
            self.outages.up(model)
        return {name: result.as_numpy(name) for name in outputs}

    async def model_states(self) -> dict[str, tuple[str, str]]:
        """Every model in Triton's repository index: its state (READY, LOADING, UNAVAILABLE, ...) and
        Triton's reason for it."""
        index = await self._probe(
            self._client.get_model_repository_index(client_timeout=self.probe_timeout_s)
        )
        return {model.name: (model.state, model.reason) for model in index.models}

    async def config(self, model: str) -> model_config_pb2.ModelConfig:
        return (
            await self._probe(
                self._client.get_model_config(model, client_timeout=self.probe_timeout_s)
            )
        ).config

    async def unready(self, models: Sequence[str]) -> list[str] | None:
        """Those of `models` Triton cannot serve now, from one index call; None while Triton
        itself is unreachable or not live. (Server readiness would not do: under strict readiness
        one model down makes the whole server unready.)"""
        try:
            if not await self._client.is_server_live(client_timeout=self.probe_timeout_s):
                return None
            states = await self.model_states()
        except (InferenceServerException, GatewayError):
            return None
        return [m for m in models if states.get(m, ("",))[0] != READY]

    def start_probing(self, models: Callable[[], Sequence[str]]) -> None:
        """Nothing to do: a lone Triton is tried whatever its health (see `ReplicaPool.start_probing`)."""

    async def _probe(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except InferenceServerException as exc:
            raise translate_error(exc, self.url, self.probe_timeout_s) from None

    async def close(self) -> None:
        await self._client.close()
