"""`prensa gateway`: the OpenAI- and TEI-compatible HTTP API in front of a running Triton.

`with_gateway_options` gives a command one option per GatewaySettings field (and the listen address),
each also read from a PRENSA_* environment variable: `prensa gateway`, `serve` and `up` share it, so
a new setting reaches all three.
"""

from __future__ import annotations

import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from typing import Annotated, Any, TypeVar, cast

import typer

from prensa.addresses import GATEWAY_PORT, LOOPBACK
from prensa.gateway.logs import configure_logging
from prensa.gateway.server import run_server
from prensa.gateway.settings import Flag, GatewaySettings, InvalidSetting, setting
from prensa.gateway.workers import gateway_server

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

    host: str = setting(LOOPBACK, "Address the gateway binds; anything but loopback exposes the API.")
    port: int = setting(GATEWAY_PORT, "Gateway HTTP port.")


ADDRESS_TYPES = typing.get_type_hints(GatewayAddress)


def envvar(flag: str) -> str:
    """`--max-client-batch-size` reads PRENSA_MAX_CLIENT_BATCH_SIZE (TEI's `#[clap(long, env)]`)."""
    return "PRENSA_" + flag.removeprefix("--").replace("-", "_").upper()


def flag_of(item: Field[Any]) -> Flag:
    if "flag" not in item.metadata:
        raise TypeError(f"{item.name} has no command-line flag: declare it with prensa.gateway.settings.setting")
    return cast(Flag, item.metadata["flag"])


def flag_name(item: Field[Any]) -> str:
    return flag_of(item).name or "--" + item.name.replace("_", "-")


def gateway_fields(standalone: bool) -> list[Field[Any]]:
    """The settings a command offers: serve and up set the gateway-only ones from their own Triton."""
    return [item for item in fields(GatewaySettings) if standalone or not flag_of(item).gateway_only]


def _keyword(name: str, annotation: Any, default: Any, decl: str, env: str, help: str,
             panel: str | None) -> inspect.Parameter:
    option = typer.Option(decl, envvar=env, help=help, rich_help_panel=panel)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, option])


def repeatable(item: Field[Any]) -> bool:
    return typing.get_origin(TYPES[item.name]) is tuple


def _setting_parameter(item: Field[Any], panel: str | None) -> inspect.Parameter:
    default: Any  # a tuple for a repeatable setting
    flag, annotation, default = flag_name(item), TYPES[item.name], item.default
    if repeatable(item):  # click hands a list, None when not given (`list[element] | None`, built at run time)
        annotation, default = types.GenericAlias(list, (typing.get_args(annotation)[0],)) | None, list(default) or None
    decl = f"{flag}/--no-{flag.removeprefix('--')}" if annotation is bool else flag
    return _keyword(item.name, annotation, default, decl, envvar(flag), flag_of(item).help, panel)


def address_name(item: Field[Any], standalone: bool) -> str:
    """The parameter (and flag) name: `host` on `prensa gateway`, `gateway_host` beside Triton's `host`."""
    return item.name if standalone else f"gateway_{item.name}"


def _address_parameter(item: Field[Any], standalone: bool, panel: str | None) -> inspect.Parameter:
    name = address_name(item, standalone)
    return _keyword(name, ADDRESS_TYPES[item.name], item.default, "--" + name.replace("_", "-"),
                    envvar(f"--gateway-{item.name}"), flag_of(item).help, panel)


def gateway_parameters(standalone: bool) -> list[inspect.Parameter]:
    """Typer parameters for GatewayAddress and GatewaySettings, defaults taken from both."""
    panel = None if standalone else PANEL
    return [*(_address_parameter(item, standalone, panel) for item in fields(GatewayAddress)),
            *(_setting_parameter(item, panel) for item in gateway_fields(standalone))]


def _settings(values: dict[str, Any], standalone: bool) -> GatewaySettings:
    """Take the gateway options out of a command's `values` and build the settings from them."""
    offered = gateway_fields(standalone)
    given: dict[str, Any] = {}
    for item in offered:
        value = values.pop(item.name)
        given[item.name] = tuple(value or ()) if repeatable(item) else value
        if item.name in EMPTY_MEANS_EMPTY and value is None and os.environ.get(envvar(flag_name(item))) == "":
            given[item.name] = ""
    if all(given[name] is not None for name in EXCLUSIVE):
        raise typer.BadParameter("they exclude each other (flags or PRENSA_* variables): give a prompt text or a "
                                 "prompt name, not both",
                                 param_hint=" / ".join(f"'{flag_name(i)}'" for i in offered if i.name in EXCLUSIVE))
    try:
        return GatewaySettings(**given)
    except InvalidSetting as exc:  # an empty PRENSA_API_KEY= as much as an empty --api-key
        flag = next(flag_name(item) for item in offered if item.name == exc.name)
        raise typer.BadParameter(str(exc), param_hint=f"'{flag}' / {envvar(flag)}") from exc


def with_gateway_options(*, standalone: bool = False) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Add the gateway options to a command whose signature takes `settings: GatewaySettings` and
    `address: GatewayAddress`, and hand it those two values instead (typer reads `__signature__`).
    `standalone`: `prensa gateway` itself, which also takes --triton-url and --repo."""

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name not in ("settings", "address")]
        added = gateway_parameters(standalone)
        if clash := {p.name for p in own} & {p.name for p in added}:
            raise TypeError(f"{command.__name__} has parameters named like gateway options: {sorted(clash)}")

        @functools.wraps(command)
        def wrapper(**values: Any) -> R:
            settings = _settings(values, standalone)
            address = GatewayAddress(**{item.name: values.pop(address_name(item, standalone))
                                        for item in fields(GatewayAddress)})
            return command(**values, settings=settings, address=address)

        parameters = [*own, *added]
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        return wrapper

    return decorate


@with_gateway_options(standalone=True)
def gateway(*, settings: GatewaySettings, address: GatewayAddress) -> None:
    """Serve OpenAI /v1/embeddings and TEI's API (embed, rerank, predict, ...) over Triton gRPC."""
    from prensa.gateway.server import raise_descriptor_limit
    from prensa.gateway.workers import worker_count

    configure_logging(settings.log_level, settings.json_output)
    descriptors = raise_descriptor_limit()
    typer.echo(f"prensa gateway on http://{address.host}:{address.port} (Triton {settings.triton_url}), "
               f"{worker_count(settings)} worker process(es); docs at /docs", err=True)
    typer.echo(descriptors.describe(), err=True)
    if not run_server(gateway_server(settings, address.host, address.port)):
        raise typer.Exit(1)  # uvicorn logged why (an unserved --default-model, a taken port, ...)
