"""The registry's readiness per model, as /metrics reports it (`prensa_model_ready`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prensa.gateway.core.registry import Registry


class Backend:
    """What the registry's readiness uses of a backend: `unready`, answering `down`."""

    def __init__(self, down: list[str] | None) -> None:
        self.down = down

    async def unready(self, models: Sequence[str]) -> list[str] | None:
        return self.down


def readiness(down: list[str] | None) -> dict[str, bool]:
    registry = Registry(Backend(down), Path("."), None)  # type: ignore[arg-type]
    served: dict[str, Any] = {"minilm": SimpleNamespace(name="minilm", triton_models=("minilm", "minilm_encode")),
                              "bge-m3": SimpleNamespace(name="bge-m3", triton_models=("bge-m3", "bge-m3_pool"))}
    registry.models = served
    return asyncio.run(registry.readiness())


def test_a_model_is_down_when_one_of_its_stages_is():
    assert readiness([]) == {"minilm": True, "bge-m3": True}
    assert readiness(["minilm_encode"]) == {"minilm": False, "bge-m3": True}


def test_every_model_is_down_while_the_backend_is_unreachable():
    assert readiness(None) == {"minilm": False, "bge-m3": False}


def test_a_model_of_a_task_this_gateway_does_not_know_is_left_out():
    """A repository rendered by a newer prensa may carry a task this gateway cannot serve: the
    refresh serves the others instead of failing on it."""
    from tritonclient.grpc import model_config_pb2

    from prensa.gateway.core.registry import known_task
    from prensa.manifest import Task

    def ensemble(task: str) -> model_config_pb2.ModelConfig:
        config = model_config_pb2.ModelConfig(name=task, platform="ensemble")
        config.parameters["task"].string_value = task
        return config

    assert all(known_task(ensemble(task.value)) for task in Task)
    assert not known_task(ensemble("speech-to-text"))
    assert not known_task(model_config_pb2.ModelConfig(name="plain", platform="ensemble"))
