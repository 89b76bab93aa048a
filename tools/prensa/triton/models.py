"""A running server's models changed in place: an export rendered into its repository and loaded
through Triton's repository API as a model's next version, a version promoted or rolled back,
or a version unloaded and its directories removed (`triton.versions` says how versions are named).

prensa runs Triton in explicit model-control mode, so nothing it serves changes until it is told,
and it loads every directory of the repository when it (re)starts: the repository stays the truth
a restarted Triton comes back to. A new model is rendered beside the repository first and moved in
whole, with the options the repository was built with (`repo.SERVING_RECORD`); one Triton fails to
load is unloaded from every Triton and its directories removed again, so what served before still
serves, and the error says why.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from prensa.manifest import Manifest
from prensa.triton.config import config_parameters, parse_pbtxt
from prensa.triton.repo import ModelSource, build_repository, read_serving_record
from prensa.triton.versions import (
    Lineage,
    name_problem,
    pinned,
    read_versions,
    stored_versions,
    version_name,
    write_versions,
)

LOAD_TIMEOUT_S = 600.0  # a large graph's load (and its warm-up) on a busy machine


# Held while the repository changes: one change at a time, across the gateway's processes and
# replicas on one volume (Triton reads directories only).
LOCK_FILE = ".prensa-changes.lock"


@contextmanager
def repository_lock(repo: Path) -> Iterator[None]:
    with (repo / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ModelChangeError(RuntimeError):
    """A change the repository cannot take; the message says why, and nothing was changed."""


class VersionConflict(ModelChangeError):
    """A change that asks of a version what its place forbids (the current one as a trial)."""


def add_model(
    repo: Path, triton_urls: Sequence[str], name: str, export_dir: Path
) -> tuple[str, int]:
    """Render `export_dir` as `name`'s next version into `repo` and load it on every Triton: its
    Triton model and version. A first version is what the name reaches; a later one is reachable
    pinned only (`name@N`) until promoted."""
    if problem := name_problem(name):
        raise ModelChangeError(problem)
    try:
        manifest = Manifest.read(export_dir)
    except FileNotFoundError as exc:
        raise ModelChangeError(f"{export_dir} is not a prensa export: {exc}") from None
    with repository_lock(repo):
        return _add(repo, triton_urls, name, export_dir, manifest)


def _add(
    repo: Path, triton_urls: Sequence[str], name: str, export_dir: Path, manifest: Manifest
) -> tuple[str, int]:
    versions = stored_versions(repo, name)
    if versions:
        _require_same_kind(repo, version_name(name, versions[-1]), manifest)
    version = max(versions, default=0) + 1
    model = version_name(name, version)
    try:
        written = _render(repo, ModelSource(model, export_dir, manifest))
    except ModelChangeError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the export holds, one line says it
        raise ModelChangeError(f"{export_dir} cannot be rendered as `{model}`: {exc}") from None
    try:
        for url in triton_urls:
            _load(url, written)
    except InferenceServerException as exc:
        _unload(triton_urls, written)
        _remove(repo, written)
        raise ModelChangeError(f"Triton could not load `{model}`: {exc.message()}") from None
    return model, version


def promote(repo: Path, name: str, version: int) -> Lineage:
    """Point `name` at `version` (in the repository, loaded); the version it reached before is
    kept for a rollback."""
    with repository_lock(repo):
        return _promote(repo, name, version)


def _require_stored(repo: Path, name: str, version: int) -> None:
    if version not in stored_versions(repo, name):
        raise ModelChangeError(f"`{version_name(name, version)}` is not in the repository")


def _promote(repo: Path, name: str, version: int) -> Lineage:
    _require_stored(repo, name, version)
    lineages = read_versions(repo)
    lineage = lineages.setdefault(name, Lineage())
    if lineage.current != version:
        lineage.before.append(lineage.current)
        lineage.current = version
        lineage.end_trials()  # a trial compares with the version it began beside
        write_versions(repo, lineages)
    return lineage


def rollback(repo: Path, name: str) -> Lineage:
    """Point `name` back at the version it reached before its last promotion."""
    with repository_lock(repo):
        return _rollback(repo, name)


def _rollback(repo: Path, name: str) -> Lineage:
    lineages = read_versions(repo)
    lineage = lineages.get(name)
    stored = stored_versions(repo, name)
    while lineage is not None and lineage.before and lineage.before[-1] not in stored:
        lineage.before.pop()  # removed since
    if lineage is None or not lineage.before:
        raise ModelChangeError(f"`{name}` was never promoted from another version it still has")
    lineage.current = lineage.before.pop()
    lineage.end_trials()
    write_versions(repo, lineages)
    return lineage


def end_trial(repo: Path, name: str) -> Lineage:
    """`name`'s canary or shadow ended, read and written under the repository's lock."""
    with repository_lock(repo):
        lineages = read_versions(repo)
        lineage = lineages.get(name)
        if lineage is None or (lineage.canary is None and lineage.shadow is None):
            raise ModelChangeError(f"`{name}` has no version on trial")
        lineage.end_trials()
        write_versions(repo, lineages)
        return lineage


def set_trial(
    repo: Path, name: str, version: int, *, share: float | None = None, shadow: bool = False
) -> Lineage:
    """Put `version` of `name` on trial beside the version the name reaches: as a canary that
    answers `share` of its requests, or as a shadow (`shadow`); a share of 0, or neither, ends
    the trial. Whether the model's kind allows which is the caller's to say (it knows the model)."""
    with repository_lock(repo):
        _require_stored(repo, name, version)
        lineages = read_versions(repo)
        lineage = lineages.setdefault(name, Lineage())
        if version == lineage.current:
            raise VersionConflict(
                f"`{version_name(name, version)}` is the version `{name}` reaches already"
            )
        lineage.end_trials()
        if share:
            lineage.canary, lineage.share = version, share
        elif shadow:
            lineage.shadow = version
        write_versions(repo, lineages)
        return lineage


def remove_model(repo: Path, triton_urls: Sequence[str], models: Sequence[str]) -> None:
    """Unload `models` (one version's Triton models, the one clients call first) from every
    Triton, then remove their directories and the version from the record: a Triton that
    restarts does not load them again. The version the name reaches goes only when it is the
    last one."""
    with repository_lock(repo):
        _remove_version(repo, triton_urls, models)


def _remove_version(repo: Path, triton_urls: Sequence[str], models: Sequence[str]) -> None:
    name, version = pinned(models[0])
    version = version or 1
    stored = stored_versions(repo, name)
    lineages = read_versions(repo)
    lineage = lineages.get(name, Lineage())
    if lineage.current == version and stored != [version]:
        raise ModelChangeError(
            f"`{models[0]}` is the version `{name}` reaches; promote another one first"
        )
    # the record first: no gateway sends a canary's share to a version being unloaded
    if name in lineages:
        lineage.before = [v for v in lineage.before if v != version]
        lineage.end_trials(version)
        if stored == [version]:
            del lineages[name]
        write_versions(repo, lineages)
    _unload(triton_urls, models)
    _remove(repo, models)


def _require_same_kind(repo: Path, served: str, manifest: Manifest) -> None:
    """A new version serves what the versions before it serve, so clients' requests still fit."""
    config = parse_pbtxt((repo / served / "config.pbtxt").read_text())
    task = config_parameters(config).get("task")
    if task != manifest.task.value:
        raise ModelChangeError(
            f"`{served}` serves task {task}; a new version of it must too, this export serves "
            f"{manifest.task.value}"
        )


def _render(repo: Path, source: ModelSource) -> list[str]:
    """`source` rendered beside `repo` and moved in, directory by directory, once whole; a move
    that fails takes back the ones before it. `shutil.move` copies where the repository is
    another filesystem (a mounted volume)."""
    with tempfile.TemporaryDirectory(dir=repo.parent, prefix=f".{repo.name}-adding-") as staging:
        written = build_repository([source], Path(staging), read_serving_record(repo))
        taken = [model for model in written if (repo / model).exists()]
        if taken:
            raise ModelChangeError(
                f"`{source.name}` needs {', '.join(taken)}, which the repository holds already"
            )
        moved: list[str] = []
        try:
            for model in written:
                shutil.move(Path(staging) / model, repo / model)
                moved.append(model)
        except OSError:
            _remove(repo, [*moved, *written[len(moved) : len(moved) + 1]])
            raise
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
