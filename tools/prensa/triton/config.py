"""Triton model configs: built as dicts, validated through Triton's own protobuf schema, written as
`config.pbtxt` text. A typo in a field name fails here, at build time, not when Triton loads."""

from __future__ import annotations

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


def string_parameters(values: dict[str, object]) -> ConfigDict:
    return {key: {"string_value": str(value)} for key, value in values.items()}


def dynamic_batching(queue_delay_us: int, max_queue_size: int) -> ConfigDict:
    """Bounded queue that rejects when full: overload becomes an error, not unbounded latency."""
    return {
        "max_queue_delay_microseconds": queue_delay_us,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "max_queue_size": max_queue_size,
            "allow_timeout_override": True,
        },
    }


def to_pbtxt(config: ConfigDict) -> str:
    """Validate against `ModelConfig` and render the text format Triton reads."""
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    return text_format.MessageToString(message)


def parse_pbtxt(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def config_parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    """A config's parameters as plain strings: every one prensa writes is a `string_value`."""
    return {key: value.string_value for key, value in config.parameters.items()}
