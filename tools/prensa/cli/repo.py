"""`prensa repo ...`: render exported models into a Triton model repository."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prensa.cli.options import with_options
from prensa.manifest import Manifest
from prensa.triton.repo import (
    DEFAULT_REPO,
    ModelSource,
    ServingOptions,
    build_repository,
    cache_refusal,
)
from prensa.triton.versions import name_problem

app = typer.Typer(
    help="Build Triton model repositories from exported models.", no_args_is_help=True
)
console = Console(stderr=True)


def parse_model_arg(argument: str, name: str | None) -> ModelSource:
    """`DIR` or `NAME=DIR`; the name defaults to the directory's name."""
    given, _, path = argument.partition("=") if "=" in argument else (None, "", argument)
    directory = Path(path)
    return ModelSource(
        given or name or directory.resolve().name, directory, Manifest.read(directory)
    )


def read_model_list(path: Path) -> list[ModelSource]:
    """A TOML file with a `[models]` table of `name = "export dir"` (relative to the file)."""
    table = tomllib.loads(path.read_text()).get("models")
    if not isinstance(table, dict) or not table:
        raise ValueError(f'{path} needs a [models] table of name = "export directory" entries')
    return [
        ModelSource(name, path.parent / directory, Manifest.read(path.parent / directory))
        for name, directory in table.items()
    ]


@app.command()
@with_options(ServingOptions, "options")
def build(
    exports: Annotated[
        list[str] | None,
        typer.Argument(help="Export directories from `prensa export`, as DIR or NAME=DIR."),
    ] = None,
    models_file: Annotated[
        Path | None,
        typer.Option(
            "--models", help="TOML file whose [models] table maps names to export directories."
        ),
    ] = None,
    repo: Annotated[
        Path, typer.Option(help="Model repository to write (models already there are kept).")
    ] = DEFAULT_REPO,
    name: Annotated[
        str | None, typer.Option(help="Model name when building a single export.")
    ] = None,
    *,
    options: ServingOptions,
) -> None:
    """Render tokenize -> encode -> pool ensembles (or fused models) for each export into REPO."""
    exports = exports or []
    if name and len(exports) > 1:
        raise typer.BadParameter("--name applies to a single export; use NAME=DIR for several")
    if not exports and not models_file:
        raise typer.BadParameter("give export directories, a --models file, or both")
    try:
        models = [parse_model_arg(argument, name) for argument in exports]
        models += read_model_list(models_file) if models_file else []
        if problem := next(filter(None, (name_problem(model.name) for model in models)), None):
            raise ValueError(problem)
    except (FileNotFoundError, ValueError, tomllib.TOMLDecodeError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    try:
        written = build_repository(models, repo, options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"wrote {len(written)} models to {repo}: " + ", ".join(written))
    if options.response_cache:
        refusals = {
            model.name: cache_refusal(model.manifest.task, options.pipeline) for model in models
        }
        cached = [name for name, refusal in refusals.items() if refusal is None]
        console.print(
            f"response cache on: {', '.join(cached) or 'none'} (serve with --cache-size BYTES)"
        )
        for name, refusal in refusals.items():
            if refusal:
                console.print(f"[yellow]not cached:[/] {name}: {refusal}")
