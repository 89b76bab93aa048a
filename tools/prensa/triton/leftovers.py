"""What a Triton that died abruptly leaves behind, cleared before the next one starts.

A Python-backend stub talks to Triton through a shared-memory region in /dev/shm, which Triton
unlinks when it unloads the model. A Triton killed (by the kernel's parent-death signal when
prensa is killed, by the OOM killer, by a crash the supervisor heals) unlinks nothing: its
regions stay in /dev/shm, a tmpfs of 64 MB by default in a container, until some restarts leave no
room for the next Triton's stubs. A stub still in its first handshake when Triton dies never
notices and waits for ever, holding its memory.

`clear` kills this user's stubs whose tritonserver is gone, then unlinks this user's regions that
no tritonserver or stub of this user has mapped or open. A region younger than `STALE_AFTER_S`
is left alone: another Triton may have created it a moment ago and not mapped it yet. When one of
those processes cannot be inspected nothing is unlinked: its regions cannot be told from garbage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger("prensa.triton")

SHM_DIR = Path("/dev/shm")
STUB_NAME = "triton_python_backend_stub"  # the Python backend's stub executable
REGION_PREFIX = "triton_python_backend_shm_region_"  # how the Python backend names a stub's region
TRITON_NAME = "tritonserver"
STALE_AFTER_S = 30.0  # Triton maps a region microseconds after creating it


@dataclass(frozen=True)
class Cleared:
    stubs: int  # orphaned stubs killed
    regions: int  # shared-memory regions unlinked
    region_bytes: int


class Uninspectable(Exception):
    """A process of this user whose mappings cannot be read."""


def triton_family() -> tuple[list[psutil.Process], list[psutil.Process]]:
    """This user's tritonservers and Python-backend stubs, in one pass over the processes: those
    with a tritonserver (or none needed: Triton itself), and the stubs whose tritonserver is gone. A
    process a live stub forked still has that stub's Triton above it."""
    uid, live, orphans = os.getuid(), list[psutil.Process](), list[psutil.Process]()
    for process in psutil.process_iter(["name", "cmdline", "uids"]):
        with contextlib.suppress(psutil.Error):  # exited meanwhile
            cmdline, uids = process.info["cmdline"], process.info["uids"]
            if uids is None or uids.real != uid:
                continue
            if process.info["name"] == TRITON_NAME:
                live.append(process)
            elif cmdline and Path(cmdline[0]).name == STUB_NAME:
                orphaned = not any(ancestor.name() == TRITON_NAME for ancestor in process.parents())
                (orphans if orphaned else live).append(process)
    return live, orphans


def orphaned_stubs() -> list[psutil.Process]:
    """This user's Python-backend stubs with no tritonserver above them (theirs died)."""
    return triton_family()[1]


def regions_in_use(processes: list[psutil.Process] | None = None) -> set[str]:
    """Names of the regions that `processes` (default: this user's tritonservers and stubs, the only
    processes that map them) have mapped or open."""
    used = set[str]()
    for process in triton_family()[0] if processes is None else processes:
        entry = Path("/proc") / str(process.pid)
        try:
            maps = (entry / "maps").read_text()
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited meanwhile
        except PermissionError as exc:
            raise Uninspectable(f"pid {process.pid}") from exc
        used.update(
            region_name(line) for line in (*maps.splitlines(), *targets) if REGION_PREFIX in line
        )
    return used


def region_name(path: str) -> str:
    """The region in a mapping's line or a descriptor's target ("... /dev/shm/<name> (deleted)")."""
    return path[path.index(REGION_PREFIX) :].split(" ", 1)[0]


def clear(stale_after_s: float = STALE_AFTER_S) -> Cleared:
    """Kill orphaned stubs and unlink abandoned regions (see the module docstring)."""
    live, orphans = triton_family()
    for stub in orphans:
        with contextlib.suppress(psutil.Error):
            stub.kill()
    psutil.wait_procs(orphans, timeout=5)
    try:
        used = regions_in_use(live)
    except Uninspectable as exc:
        log.warning(
            "left Triton's shared-memory regions in %s alone: cannot read the mappings of %s",
            SHM_DIR,
            exc,
        )
        return Cleared(len(orphans), 0, 0)
    uid, now, regions, size = os.getuid(), time.time(), 0, 0
    for region in SHM_DIR.glob(f"{REGION_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            status = region.stat()
            if (
                status.st_uid != uid
                or now - max(status.st_mtime, status.st_ctime) < stale_after_s
                or region.name in used
            ):
                continue
            region.unlink()
            regions, size = regions + 1, size + status.st_size
    if orphans or regions:
        log.warning(
            "cleared what Tritons that died abruptly left: %d orphaned Python-backend stubs, %d "
            "shared-memory regions (%.0f MB) in %s",
            len(orphans),
            regions,
            size / 1e6,
            SHM_DIR,
        )
    return Cleared(len(orphans), regions, size)
