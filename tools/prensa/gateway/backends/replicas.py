"""Several Triton replicas behind one gateway: least outstanding requests, health-checked.

The pool is a `prensa.gateway.backends.base.Backend`, as `TritonClient` is, so the rest of the gateway
does not know how many replicas there are. A replica that fails with Unhealthy (refused connection, deadline) is
taken out at once and the call is retried on another one, so an admitted request is not lost
to a replica dying mid-load; a background probe puts it back when it reports ready again.
Inference errors that are the request's own (424 Backend, 429 Overloaded) are not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy.typing as npt
from tritonclient.grpc import model_config_pb2

from prensa.gateway.backends.triton import TritonClient
from prensa.gateway.errors import ErrorKind, GatewayError

log = logging.getLogger("prensa.gateway")
T = TypeVar("T")


@dataclass
class Replica:
    client: TritonClient
    healthy: bool = True
    outstanding: int = 0


class ReplicaPool:
    def __init__(self, clients: Sequence[TritonClient], probe_interval_s: float = 1.0) -> None:
        if not clients:
            raise ValueError("a replica pool needs at least one Triton URL")
        self.replicas = [Replica(client) for client in clients]
        self.probe_interval_s = probe_interval_s
        self._models: Callable[[], Sequence[str]] = tuple
        self._probe_task: asyncio.Task[Any] | None = None

    @property
    def url(self) -> str:
        return ",".join(r.client.url for r in self.replicas)

    @property
    def replica_count(self) -> int:
        return len(self.replicas)

    def start_probing(self, models: Callable[[], Sequence[str]]) -> None:
        """Health-check every replica in the background; `models()` (read at each probe) must be ready
        for 'healthy'. One replica is never probed: it is tried whatever its health."""
        self._models = models
        if self._probe_task is None and len(self.replicas) > 1:
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_forever())

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            await self.unready(self._models())

    def _pick(self, tried: set[int]) -> int | None:
        candidates = [i for i, r in enumerate(self.replicas) if i not in tried and r.healthy]
        # every replica looks down: try the untried ones anyway, they may be back
        if not candidates:
            candidates = [i for i in range(len(self.replicas)) if i not in tried]
        return min(candidates, key=lambda i: self.replicas[i].outstanding, default=None)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
        request_id: str = "",
    ) -> dict[str, npt.NDArray[Any]]:
        tried: set[int] = set()
        failure: GatewayError | None = None
        while (index := self._pick(tried)) is not None:
            tried.add(index)
            replica = self.replicas[index]
            replica.outstanding += 1
            try:
                return await replica.client.infer(model, inputs, outputs, request_id)
            except GatewayError as exc:
                if exc.kind is not ErrorKind.UNHEALTHY:
                    raise
                replica.healthy = False
                if len(self.replicas) > 1:
                    log.warning(
                        "Triton replica %s failed (%s); retrying elsewhere",
                        replica.client.url,
                        exc.message,
                    )
                failure = exc
            finally:
                replica.outstanding -= 1
        raise failure or GatewayError(ErrorKind.UNHEALTHY, "no Triton replica answered")

    async def _first_answer(self, call: Callable[[TritonClient], Awaitable[T]]) -> T:
        failure: GatewayError | None = None
        for replica in sorted(self.replicas, key=lambda r: not r.healthy):
            try:
                return await call(replica.client)
            except GatewayError as exc:
                failure = exc
        raise failure or GatewayError(ErrorKind.UNHEALTHY, "no Triton replica answered")

    async def model_states(self) -> dict[str, tuple[str, str]]:
        return await self._first_answer(lambda client: client.model_states())

    async def config(self, model: str) -> model_config_pb2.ModelConfig:
        return await self._first_answer(lambda client: client.config(model))

    async def unready(self, models: Sequence[str]) -> list[str]:
        """Those of `models` no replica can serve now (all of them while none answers); a replica
        is healthy while it serves every one."""
        answers = await asyncio.gather(*(r.client.unready(models) for r in self.replicas))
        for replica, unready in zip(self.replicas, answers):
            ready = unready == []
            if ready != replica.healthy:
                log.warning(
                    "Triton replica %s is %s", replica.client.url, "back" if ready else "down"
                )
            replica.healthy = ready
        return [m for m in models if all(unready is None or m in unready for unready in answers)]

    async def close(self) -> None:
        if self._probe_task:
            self._probe_task.cancel()
        await asyncio.gather(*(r.client.close() for r in self.replicas))
