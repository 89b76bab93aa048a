"""Command groups whose first command runs when none is named: `prensa bench EXPORT` and
`prensa loadtest [SCENARIO]` kept their meaning when measures of their own joined them."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup


def default_command_group(default: str) -> type[TyperGroup]:
    """A group class that runs `default` when the first word names none of its commands, or when
    there is none and the group does not answer that with its help; `--help` shows the group's."""

    class DefaultCommandGroup(TyperGroup):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click Context
            unnamed = (
                args[0] not in self.commands and args[0] not in ctx.help_option_names
                if args
                else not self.no_args_is_help
            )
            if unnamed:
                args = [default, *args]
            return super().parse_args(ctx, args)

    return DefaultCommandGroup
