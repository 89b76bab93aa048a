"""Options classes whose fields carry their command-line flag.

A field declared with `setting` holds its default, its flag and the flag's help in one place; the
CLI (`prensa.cli.options`) builds its options from these fields, and the class's `__post_init__`
checks the values, so Python callers and the command line refuse the same things.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, dataclass, field
from typing import Any, cast


@dataclass(frozen=True)
class Flag:
    """How a field appears on the command line."""

    help: str
    name: str | None = None  # default: --field-name
    gateway_only: bool = False  # serve/up set it themselves (their own Triton and --repo)
    # the flag takes one text that this turns into the value
    parse: Callable[[str], Any] | None = None


class InvalidSetting(ValueError):
    """A value no option class accepts; `name` is the field, for the CLI to name its flag."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    gateway_only: bool = False,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A field with its default and command-line flag."""
    return field(default=default, metadata={"flag": Flag(help, flag, gateway_only, parse)})


def internal(default: Any) -> Any:
    """A field set by code, not by a flag."""
    return field(default=default, metadata={"flag": None})


def flag_of(item: Field[Any]) -> Flag | None:
    """The field's flag, None for an `internal` one; a plain field is a mistake the CLI must not hide."""
    if "flag" not in item.metadata:
        raise TypeError(
            f"{item.name} has no command-line flag: declare it with prensa.options.setting "
            "(or prensa.options.internal)"
        )
    return cast("Flag | None", item.metadata["flag"])


def command_flag(item: Field[Any]) -> Flag:
    """The flag of a field that must have one."""
    if (flag := flag_of(item)) is None:
        raise TypeError(f"{item.name} is set by code only: it has no command-line flag")
    return flag


def flag_name(item: Field[Any]) -> str:
    flag = flag_of(item)
    return (flag.name if flag else None) or "--" + item.name.replace("_", "-")


def require_positive(owner: object, *names: str, allow_zero: tuple[str, ...] = ()) -> None:
    """Refuse a negative value (or zero, unless named in `allow_zero`) of the named fields; None passes."""
    for name in names:
        value = getattr(owner, name)
        if value is not None and (value < 0 or (value == 0 and name not in allow_zero)):
            bound = "zero or more" if name in allow_zero else "positive"
            raise InvalidSetting(name, f"must be {bound}, got {value}")
