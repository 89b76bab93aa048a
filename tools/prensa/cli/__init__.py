"""The `prensa` command line: one module per command group."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import typer

from prensa.cli import bench, deploy, loadtest, models, repo
from prensa.cli.corpus import embed_corpus
from prensa.cli.export import calibrate, export
from prensa.cli.gateway import gateway
from prensa.cli.serve import serve, up
from prensa.cli.stats import stats
from prensa.cli.tune import tune

app = typer.Typer(
    help="Serve embedders, rerankers and SPLADE models through NVIDIA Triton.",
    no_args_is_help=True,
    context_settings={"auto_envvar_prefix": "PRENSA"},
)
app.command()(export)
app.command()(calibrate)
app.add_typer(repo.app, name="repo")
app.add_typer(deploy.app, name="deploy")
app.command()(serve)
app.command()(up)
app.add_typer(models.app, name="models")
app.command()(gateway)
app.command()(stats)
app.add_typer(bench.app, name="bench")
app.command()(tune)
app.add_typer(loadtest.app, name="loadtest")
app.command("embed-corpus")(embed_corpus)


def commands(command: Any) -> Iterator[Any]:
    """`command` and its subcommands (typer's own click classes: duck-typed)."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from commands(sub)


def command_line(typer_app: typer.Typer = app) -> Any:
    """The click command `prensa` runs: typer's, with what its declarations cannot say: a flag
    prints no `<bool>` type in --help, and typer's own --install-completion / --show-completion
    read no PRENSA_* variable (the commands' options read PRENSA_<COMMAND>_<OPTION> or their own)."""
    command = typer.main.get_command(typer_app)
    for each in commands(command):
        # --help is made on first use and kept (`get_help_option`, which reads only the context's names)
        help_option = each.get_help_option(SimpleNamespace(help_option_names=["--help"]))
        for param in [*each.params, *([help_option] if help_option is not None else [])]:
            if getattr(param, "is_flag", False):
                param.metavar = ""
            if param.name in ("install_completion", "show_completion"):
                param.allow_from_autoenv = False
    return command


def main() -> None:
    """The `prensa` console script."""
    command_line()()
