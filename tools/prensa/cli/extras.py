"""The optional dependencies (pyproject.toml's extras) that some commands need.

The core install serves: `repo build`, `serve`, `gateway`, `stats` and `deploy k8s` import no torch,
transformers, pyarrow, ray, matplotlib, locust or aiohttp. Commands that need one import it inside
their own body, after `require` has said which extra to install, instead of a traceback
(`embed-corpus --ray-address` names the distributed extra itself).
"""

from __future__ import annotations

import importlib.util

import typer
from rich.console import Console
from rich.markup import escape

# What `pip install 'prensa[EXTRA]'` brings that prensa imports, by extra.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "export": (
        "torch",
        "transformers",
        "onnxscript",
        "huggingface_hub",
        "safetensors",
        "sentence_transformers",
    ),
    "corpus": ("pyarrow",),
    "bench": ("matplotlib", "aiohttp", "locust"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, command: str) -> None:
    """Exit 2, naming the extra to install, when `prensa COMMAND` lacks a module of `extra`."""
    missing = missing_modules(extra)
    if missing:
        install = escape(f"pip install 'prensa[{extra}]'")  # not a markup tag
        Console(stderr=True).print(
            f"[red]error:[/] prensa {command} needs {', '.join(missing)}: {install}"
        )
        raise typer.Exit(2)
