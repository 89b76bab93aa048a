"""Triton model configs: built as dicts, validated through Triton's own protobuf schema, written as
`config.pbtxt` text. A typo in a field name fails here, at build time, not when Triton loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

ConfigDict = dict[str, Any]


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton's TYPE_* name
    dims: list[int]
    optional: bool = False
    ragged: bool = False

    def as_input(self) -> ConfigDict:
        entry: ConfigDict = {"name": self.name, "data_type": self.data_type, "dims": self.dims}
        if self.optional:
            entry["optional"] = True
        if self.ragged:
            entry["allow_ragged_batch"] = True
        return entry

    def as_output(self) -> ConfigDict:
        return {"name": self.name, "data_type": self.data_type, "dims": self.dims}


def string_parameters(values: Mapping[str, object]) -> ConfigDict:
    return {key: {"string_value": str(value)} for key, value in values.items()}


def dynamic_batching(queue_delay_us: int, max_queue_size: int) -> ConfigDict:
    """Triton's dynamic batcher; `max_queue_size` > 0 bounds its queue (rejecting when full), 0 leaves
    it unbounded behind the gateway's own admission (429 once its permits are taken).

    Unbounded is the default because any queue policy switches off the batcher's payload prefetching,
    and Triton then waits for a free instance on a condition variable whose wake-up can land just
    before the instance is idle again: the waiter misses it and sleeps its default timeout. A
    one-instance model meets that stall on a share of a lone client's requests, and never without
    the policy (docs/performance.md, "Bounded queue stall")."""
    batching: ConfigDict = {"max_queue_delay_microseconds": queue_delay_us}
    if max_queue_size > 0:
        batching["default_queue_policy"] = {
            "timeout_action": "REJECT",
            "max_queue_size": max_queue_size,
            "allow_timeout_override": True,
        }
    return batching


def to_pbtxt(config: ConfigDict) -> str:
    """Validate against `ModelConfig` and render the text format Triton reads."""
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    return text_format.MessageToString(message)


def parse_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def config_parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    """A config's parameters as plain strings: every one prensa writes is a `string_value`."""
    return {key: value.string_value for key, value in config.parameters.items()}
