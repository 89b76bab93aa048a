"""`prensa gateway`: the OpenAI- and TEI-compatible HTTP API in front of a running Triton.

`with_gateway_options` gives a command one option per GatewaySettings field (and the listen address),
each also read from a PRENSA_* environment variable: `prensa gateway`, `serve` and `up` share it, so
a new setting reaches all three.
"""

from __future__ import annotations

import inspect
import os
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from typing import Any, TypeVar

import typer

from prensa.addresses import GATEWAY_PORT, LOOPBACK
from prensa.cli.options import (
    adding_parameters,
    construct,
    envvar,
    field_parameter,
    field_value,
    option_parameter,
    parameter_name,
)
from prensa.gateway.logs import configure_logging
from prensa.gateway.server import run_server
from prensa.gateway.settings import GatewaySettings
from prensa.gateway.workers import gateway_server
from prensa.options import command_flag, flag_name, setting

R = TypeVar("R")
PANEL = "Gateway"  # the --help panel of the gateway options of serve and up
EXCLUSIVE = ("default_prompt", "default_prompt_name")  # settings that exclude each other
# click reads a variable set to "" as unset; for these that would serve without what the operator
# meant to set (PRENSA_API_KEY= is no key, hence no authentication), so "" reaches the settings' check.
EMPTY_MEANS_EMPTY = ("api_key",)
TYPES = typing.get_type_hints(GatewaySettings)


@dataclass(frozen=True)
class GatewayAddress:
    """Where the gateway listens: the CLI's business, not the app's, hence not a GatewaySettings field.
    `--host/--port` on `prensa gateway`, `--gateway-host/--gateway-port` beside Triton's own; the
    environment variables are PRENSA_GATEWAY_HOST/PORT for all three commands."""

    host: str = setting(
        LOOPBACK, "Address the gateway binds; anything but loopback exposes the API."
    )
    port: int = setting(GATEWAY_PORT, "Gateway HTTP port.")


ADDRESS_TYPES = typing.get_type_hints(GatewayAddress)


def gateway_fields(standalone: bool) -> list[Field[Any]]:
    """The settings a command offers: serve and up set the gateway-only ones from their own Triton."""
    return [
        item
        for item in fields(GatewaySettings)
        if standalone or not command_flag(item).gateway_only
    ]


def address_name(item: Field[Any], standalone: bool) -> str:
    """The parameter (and flag) name: `host` on `prensa gateway`, `gateway_host` beside Triton's `host`."""
    return item.name if standalone else f"gateway_{item.name}"


def _address_parameter(item: Field[Any], standalone: bool, panel: str | None) -> inspect.Parameter:
    name = address_name(item, standalone)
    return option_parameter(
        name,
        ADDRESS_TYPES[item.name],
        item.default,
        "--" + name.replace("_", "-"),
        command_flag(item).help,
        env=envvar(f"--gateway-{item.name}"),
        panel=panel,
    )


def gateway_parameters(standalone: bool) -> list[inspect.Parameter]:
    """Typer parameters for GatewayAddress and GatewaySettings, defaults taken from both."""
    panel = None if standalone else PANEL
    return [
        *(_address_parameter(item, standalone, panel) for item in fields(GatewayAddress)),
        *(
            field_parameter(item, TYPES[item.name], own_env=True, panel=panel)
            for item in gateway_fields(standalone)
        ),
    ]


def _settings(values: dict[str, Any], standalone: bool) -> GatewaySettings:
    """Take the gateway options out of a command's `values` and build the settings from them."""
    offered = gateway_fields(standalone)
    given: dict[str, Any] = {}
    for item in offered:
        value = values.pop(parameter_name(item))
        given[item.name] = field_value(item, TYPES[item.name], value)
        if (
            item.name in EMPTY_MEANS_EMPTY
            and value is None
            and os.environ.get(envvar(flag_name(item))) == ""
        ):
            given[item.name] = ""
    if all(given[name] is not None for name in EXCLUSIVE):
        raise typer.BadParameter(
            "they exclude each other (flags or PRENSA_* variables): give a prompt text or a "
            "prompt name, not both",
            param_hint=" / ".join(f"'{flag_name(i)}'" for i in offered if i.name in EXCLUSIVE),
        )
    # an empty PRENSA_API_KEY= as much as an empty --api-key
    return construct(GatewaySettings, given, own_env=True)


def with_gateway_options(
    *, standalone: bool = False
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Add the gateway options to a command whose signature takes `settings: GatewaySettings` and
    `address: GatewayAddress`, and hand it those two values instead.
    `standalone`: `prensa gateway` itself, which also takes --triton-url and --repo."""

    def build(values: dict[str, Any]) -> dict[str, Any]:
        settings = _settings(values, standalone)
        address = GatewayAddress(
            **{
                item.name: values.pop(address_name(item, standalone))
                for item in fields(GatewayAddress)
            }
        )
        return {"settings": settings, "address": address}

    return adding_parameters(gateway_parameters(standalone), ("settings", "address"), build)


@with_gateway_options(standalone=True)
def gateway(*, settings: GatewaySettings, address: GatewayAddress) -> None:
    """Serve OpenAI /v1/embeddings and TEI's API (embed, rerank, predict, ...) over Triton gRPC."""
    from prensa.gateway.server import raise_descriptor_limit
    from prensa.gateway.workers import worker_count

    configure_logging(settings.log_level, settings.json_output)
    descriptors = raise_descriptor_limit()
    typer.echo(
        f"prensa gateway on http://{address.host}:{address.port} (Triton {settings.triton_url}), "
        f"{worker_count(settings)} worker process(es); docs at /docs",
        err=True,
    )
    typer.echo(descriptors.describe(), err=True)
    if not run_server(gateway_server(settings, address.host, address.port)):
        raise typer.Exit(1)  # uvicorn logged why (an unserved --default-model, a taken port, ...)
