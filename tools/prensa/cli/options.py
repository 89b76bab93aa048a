"""Command options made from an options class's fields (`prensa.options.setting`).

`with_options` gives a command one option per field of a frozen options class and hands the
command the built value instead: the class keeps each default, flag, help text and check, so a
field added there reaches every command that takes the class, and a command cannot drift from it.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import Field, fields
from typing import Annotated, Any, TypeVar

import typer

from prensa.options import InvalidSetting, command_flag, flag_name, flag_of

R = TypeVar("R")
# pops a command's option values, returns what it injects
Build = Callable[[dict[str, Any]], dict[str, Any]]


def envvar(flag: str) -> str:
    """`--max-client-batch-size` reads PRENSA_MAX_CLIENT_BATCH_SIZE (TEI's `#[clap(long, env)]`)."""
    return "PRENSA_" + flag.removeprefix("--").replace("-", "_").upper()


def flagged_fields(cls: type, only: Iterable[str] | None = None) -> list[Field[Any]]:
    """The fields of `cls` that have a flag (all, or those named in `only`, in the class's order)."""
    wanted = set(only) if only is not None else None
    chosen = [
        item
        for item in fields(cls)
        if flag_of(item) is not None and (wanted is None or item.name in wanted)
    ]
    if wanted is not None and (unknown := wanted - {item.name for item in chosen}):
        raise TypeError(f"{cls.__name__} has no flagged fields named {sorted(unknown)}")
    return chosen


def option_parameter(
    name: str,
    annotation: Any,
    default: Any,
    decl: str,
    help: str,
    *,
    env: str | None = None,
    panel: str | None = None,
) -> inspect.Parameter:
    """A keyword parameter typer reads as one option; `env` None leaves the variable to click's
    PRENSA_<COMMAND>_<OPTION>."""
    option = typer.Option(decl, envvar=env, help=help, rich_help_panel=panel)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, option],
    )


def repeatable(annotation: Any) -> bool:
    return typing.get_origin(annotation) is tuple


def parameter_name(item: Field[Any]) -> str:
    """The command's parameter of a field, named after its flag: click names a variable after it."""
    return flag_name(item).removeprefix("--").replace("-", "_")


def field_parameter(
    item: Field[Any], annotation: Any, *, own_env: bool, panel: str | None = None
) -> inspect.Parameter:
    """The option of one field: a repeatable flag for a tuple, a --x/--no-x pair for a bool, a text
    for a field whose flag parses one; `own_env`: PRENSA_<FLAG> rather than click's per-command name."""
    flag, default, declared = flag_name(item), item.default, command_flag(item)
    # one text, parsed when the value is built; None: the field's default
    if declared.parse is not None:
        annotation, default = str | None, None
    elif repeatable(annotation):  # click hands a list, None when not given (`list[element] | None`)
        annotation = types.GenericAlias(list, (typing.get_args(annotation)[0],)) | None
        default = list(typing.cast(tuple[Any, ...], default)) or None
    switch = annotation is bool or set(typing.get_args(annotation)) == {bool, type(None)}
    decl = f"{flag}/--no-{flag.removeprefix('--')}" if switch else flag
    return option_parameter(
        parameter_name(item),
        annotation,
        default,
        decl,
        declared.help,
        env=envvar(flag) if own_env else None,
        panel=panel,
    )


def field_value(item: Field[Any], annotation: Any, value: Any) -> Any:
    """A command's value of one field as the options class takes it."""
    declared = flag_of(item)
    if declared is not None and declared.parse is not None:
        try:
            return item.default if value is None else declared.parse(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=f"'{flag_name(item)}'") from exc
    return tuple(value or ()) if repeatable(annotation) else value


def construct(cls: type[R], given: dict[str, Any], *, own_env: bool) -> R:
    """`cls(**given)`, its refusal (`InvalidSetting`) turned into a usage error naming the flag."""
    try:
        return cls(**given)
    except InvalidSetting as exc:
        item = next(item for item in fields(cls) if item.name == exc.name)  # type: ignore[arg-type]
        flag = flag_name(item)
        raise typer.BadParameter(
            str(exc), param_hint=f"'{flag}' / {envvar(flag)}" if own_env else f"'{flag}'"
        ) from exc
    except ValueError as exc:  # a check across fields, whose message names its flags
        raise typer.BadParameter(str(exc)) from exc


def adding_parameters(
    added: list[inspect.Parameter], injected: tuple[str, ...], build: Build
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Give a command the `added` options and hand it what `build` makes of their values, under the
    `injected` parameter names of its signature (typer reads `__signature__`)."""

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name not in injected]
        if clash := {p.name for p in own} & {p.name for p in added}:
            raise TypeError(
                f"{command.__name__} has parameters named like added options: {sorted(clash)}"
            )

        @functools.wraps(command)
        def wrapper(**values: Any) -> R:
            made = build(values)
            return command(**values, **made)

        parameters = [*own, *added]
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {
            "return": signature.return_annotation
        }
        return wrapper

    return decorate


def with_options(
    cls: type,
    parameter: str,
    *,
    only: Iterable[str] | None = None,
    own_env: bool = False,
    panel: str | None = None,
    passed: Iterable[str] = (),
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Options for the flagged fields of `cls` (or `only` those), handed to the command as one `cls`
    value in its `parameter`; fields left out keep their defaults. `passed`: fields without a flag
    that the command's own parameters of those names give (an argument, a required option)."""
    offered = flagged_fields(cls, only)
    hints = typing.get_type_hints(cls)
    own = tuple(passed)

    def build(values: dict[str, Any]) -> dict[str, Any]:
        given = {
            item.name: field_value(item, hints[item.name], values.pop(parameter_name(item)))
            for item in offered
        }
        given.update({name: values[name] for name in own})
        return {parameter: construct(cls, given, own_env=own_env)}

    added = [
        field_parameter(item, hints[item.name], own_env=own_env, panel=panel) for item in offered
    ]
    return adding_parameters(added, (parameter,), build)
