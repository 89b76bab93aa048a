"""A running server's models changed in place: an export rendered into its repository and loaded
through Triton's repository API, or a model unloaded and its directories removed.

prensa runs Triton in explicit model-control mode, so nothing it serves changes until it is told,
and it loads every directory of the repository when it (re)starts: the repository stays the truth
a restarted Triton comes back to. A new model is rendered beside the repository first and moved in
whole, with the options the repository was built with (`repo.SERVING_RECORD`); one Triton fails to
load is unloaded from every Triton and its directories removed again, so what served before still
serves, and the error says why.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from prensa.manifest import Manifest
from prensa.triton.repo import ModelSource, build_repository, read_serving_record

LOAD_TIMEOUT_S = 600.0  # a large graph's load (and its warm-up) on a busy machine
# a model name Triton and every client can carry: a directory name, no path, no `@`
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ModelChangeError(RuntimeError):
    """A model that cannot be added or removed; the message says why, and nothing was changed."""


def add_model(repo: Path, triton_urls: Sequence[str], name: str, export_dir: Path) -> list[str]:
    """Render `export_dir` as model `name` into `repo` and load it on every Triton; the Triton
    models written, the one clients call first."""
    if not MODEL_NAME.fullmatch(name):
        raise ModelChangeError(
            f"{name!r} is not a model name: letters, digits, `.`, `_` and `-`, a letter or digit first"
        )
    try:
        manifest = Manifest.read(export_dir)
    except FileNotFoundError as exc:
        raise ModelChangeError(f"{export_dir} is not a prensa export: {exc}") from None
    if (repo / name).exists():
        raise ModelChangeError(f"`{name}` is in the repository already; remove it first")
    try:
        written = _render(repo, ModelSource(name, export_dir, manifest))
    except ModelChangeError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the export holds, one line says it
        raise ModelChangeError(f"{export_dir} cannot be rendered as `{name}`: {exc}") from None
    try:
        for url in triton_urls:
            _load(url, written)
    except InferenceServerException as exc:
        _unload(triton_urls, written)
        _remove(repo, written)
        raise ModelChangeError(f"Triton could not load `{name}`: {exc.message()}") from None
    return written


def remove_model(repo: Path, triton_urls: Sequence[str], models: Sequence[str]) -> None:
    """Unload `models` (a served model's Triton models, the one clients call first) from every
    Triton, then remove their directories: a Triton that restarts does not load them again."""
    _unload(triton_urls, models)
    _remove(repo, models)


def _render(repo: Path, source: ModelSource) -> list[str]:
    """`source` rendered beside `repo` and moved in, directory by directory, once whole."""
    with tempfile.TemporaryDirectory(dir=repo.parent, prefix=f".{repo.name}-adding-") as staging:
        written = build_repository([source], Path(staging), read_serving_record(repo))
        taken = [model for model in written if (repo / model).exists()]
        if taken:
            raise ModelChangeError(
                f"`{source.name}` needs {', '.join(taken)}, which the repository holds already"
            )
        for model in written:
            os.replace(Path(staging) / model, repo / model)
    return written


def _load(url: str, models: Sequence[str]) -> None:
    """Its stages first, then the model clients call (whose load would pull them in anyway)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        for model in reversed(models):
            client.load_model(model, client_timeout=LOAD_TIMEOUT_S)
    finally:
        client.close()


def _unload(triton_urls: Sequence[str], models: Sequence[str]) -> None:
    """Unloaded wherever Triton knows them; one already gone is no error. Triton lets the requests
    it holds finish first."""
    for url in triton_urls:
        client = grpcclient.InferenceServerClient(url)
        try:
            for model in models:
                try:
                    client.unload_model(model)
                except InferenceServerException:
                    continue
        finally:
            client.close()


def _remove(repo: Path, models: Sequence[str]) -> None:
    for model in models:
        shutil.rmtree(repo / model, ignore_errors=True)
