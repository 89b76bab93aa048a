"""A served model's versions: each one its own set of Triton models, and which one the name alone
reaches.

The first version of `name` is the Triton model `name` (what `repo build` writes), a later one
`name@N`, so every version loads, reloads and unloads on its own and a client pins one by asking
for `name@N`, a form every client library can send as its model name. Which version the name
alone reaches is kept beside the models in `VERSIONS_RECORD`, with the versions it reached before,
so that promotion and rollback are one write each (a temporary file renamed over the record),
read by every gateway on the same repository. The record also names a version on trial: a
relevance model's canary, which answers a share of the name's requests, or an embedder's shadow,
which only sees a copy of them (vectors of two versions do not mix).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PIN = "@"
VERSIONS_RECORD = "prensa-versions.json"
# a model name Triton and every client can carry: a directory name, no path, no `@` (a version pin)
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a served model, or None."""
    if MODEL_NAME.fullmatch(name):
        return None
    pins = f" (`{PIN}` pins a version: {name.partition(PIN)[0]}{PIN}2)" if PIN in name else ""
    return (
        f"{name!r} is not a model name: letters, digits, `.`, `_` and `-`, a letter or digit "
        f"first{pins}"
    )


def version_name(name: str, version: int) -> str:
    """The Triton model of `name`'s `version`."""
    return name if version == 1 else f"{name}{PIN}{version}"


def pin(name: str, version: int) -> str:
    """How a client pins `name`'s `version`: `name@N`, the first version's too."""
    return f"{name}{PIN}{version}"


def pinned(model: str) -> tuple[str, int | None]:
    """`name@N` as (name, N); a name alone as (name, None). A pin that is not a version number
    is part of the name (no model has one: `MODEL_NAME`)."""
    name, mark, version = model.rpartition(PIN)
    if mark and version.isdigit() and int(version) >= 1:
        return name, int(version)
    return model, None


def version_of(model: str) -> int:
    """The version a Triton model serves."""
    return pinned(model)[1] or 1


@dataclass
class Lineage:
    """Where a model's name points, where it pointed before (the last one last), and the
    version on trial beside it, if any."""

    current: int = 1
    before: list[int] = field(default_factory=list)
    canary: int | None = None  # answers `share` of the name's requests (relevance models only)
    share: float = 0.0
    shadow: int | None = None  # sent a copy of the name's requests, never answers (embedders)

    def end_trials(self, version: int | None = None) -> None:
        """No version on trial any more (only `version`'s trial, when given)."""
        if version is None or self.canary == version:
            self.canary, self.share = None, 0.0
        if version is None or self.shadow == version:
            self.shadow = None

    def as_record(self) -> dict[str, object]:
        record: dict[str, object] = {"current": self.current, "before": self.before}
        if self.canary is not None:
            record |= {"canary": self.canary, "share": self.share}
        if self.shadow is not None:
            record["shadow"] = self.shadow
        return record


def read_versions(repo: Path) -> dict[str, Lineage]:
    """Each model's lineage; a model the record does not name is at its first version."""
    path = repo / VERSIONS_RECORD
    if not path.is_file():
        return {}
    return {
        name: Lineage(
            int(entry["current"]),
            [int(v) for v in entry.get("before", [])],
            None if entry.get("canary") is None else int(entry["canary"]),
            float(entry.get("share", 0.0)),
            None if entry.get("shadow") is None else int(entry["shadow"]),
        )
        for name, entry in json.loads(path.read_text()).items()
    }


def versions_stamp(repo: Path) -> tuple[int, int] | None:
    """Which record is there (None: none): each write renames a new file over it, so its inode
    changes with every write, however close in time; a reader reads it again when it moves."""
    try:
        stat = (repo / VERSIONS_RECORD).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def write_versions(repo: Path, lineages: dict[str, Lineage]) -> None:
    """The record replaced whole: a reader sees the old one or the new one."""
    with tempfile.NamedTemporaryFile(
        "w", dir=repo, prefix=f".{VERSIONS_RECORD}-", suffix=".tmp", delete=False
    ) as out:
        staged = Path(out.name)
    staged.write_text(
        json.dumps({name: one.as_record() for name, one in lineages.items()}, indent=2) + "\n"
    )
    os.replace(staged, repo / VERSIONS_RECORD)


def stored_versions(repo: Path, name: str) -> list[int]:
    """The versions of `name` whose model is in the repository, in order."""
    found = [1] if (repo / name).is_dir() else []
    prefix = f"{name}{PIN}"
    for path in repo.glob(f"{prefix}*"):
        version = pinned(path.name)[1]
        if path.is_dir() and pinned(path.name)[0] == name and version:
            found.append(version)
    return sorted(found)
