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
COMM_LENGTH = 15  # the kernel keeps this much of a process's name in /proc/<pid>/comm
STALE_AFTER_S = 30.0  # Triton maps a region microseconds after creating it


@dataclass(frozen=True)
class Cleared:
    stubs: int  # orphaned stubs killed
    regions: int  # shared-memory regions unlinked
    region_bytes: int


class Uninspectable(Exception):
    """A process of this user whose mappings cannot be read."""


def orphaned_stubs() -> list[psutil.Process]:
    """This user's Python-backend stubs with no tritonserver above them (theirs died). A process a
    live stub forked still has that stub's Triton above it."""
    uid, orphans = os.getuid(), list[psutil.Process]()
    for process in psutil.process_iter(["cmdline", "uids"]):
        with contextlib.suppress(psutil.Error):
            cmdline, uids = process.info["cmdline"], process.info["uids"]
            if not cmdline or Path(cmdline[0]).name != STUB_NAME or uids is None or uids.real != uid:
                continue
            if not any(ancestor.name() == TRITON_NAME for ancestor in process.parents()):
                orphans.append(process)
    return orphans


def triton_processes() -> list[Path]:
    """/proc entries of this user's tritonservers and stubs: the only processes that map regions."""
    uid, found = os.getuid(), []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):  # exited meanwhile, or not ours to read
            if entry.name.isdigit() and entry.stat().st_uid == uid and \
                    (entry / "comm").read_text().strip() in (TRITON_NAME, STUB_NAME[:COMM_LENGTH]):
                found.append(entry)
    return found


def regions_in_use() -> set[str]:
    """Names of the regions that a tritonserver or stub of this user has mapped or open."""
    used = set[str]()
    for entry in triton_processes():
        try:
            maps = (entry / "maps").read_text()
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited meanwhile
        except PermissionError as exc:
            raise Uninspectable(f"pid {entry.name}") from exc
        used.update(region_name(line) for line in (*maps.splitlines(), *targets) if REGION_PREFIX in line)
    return used


def region_name(path: str) -> str:
    """The region in a mapping's line or a descriptor's target ("... /dev/shm/<name> (deleted)")."""
    return path[path.index(REGION_PREFIX):].split(" ", 1)[0]


def clear(stale_after_s: float = STALE_AFTER_S) -> Cleared:
    """Kill orphaned stubs and unlink abandoned regions (see the module docstring)."""
    orphans = orphaned_stubs()
    for stub in orphans:
        with contextlib.suppress(psutil.Error):
            stub.kill()
    psutil.wait_procs(orphans, timeout=5)
    try:
        used = regions_in_use()
    except Uninspectable as exc:
        log.warning("left Triton's shared-memory regions in %s alone: cannot read the mappings of %s", SHM_DIR, exc)
        return Cleared(len(orphans), 0, 0)
    uid, now, regions, size = os.getuid(), time.time(), 0, 0
    for region in SHM_DIR.glob(f"{REGION_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            status = region.stat()
            if status.st_uid != uid or now - max(status.st_mtime, status.st_ctime) < stale_after_s \
                    or region.name in used:
                continue
            region.unlink()
            regions, size = regions + 1, size + status.st_size
    if orphans or regions:
        log.warning("cleared what Tritons that died abruptly left: %d orphaned Python-backend stubs, %d "
                    "shared-memory regions (%.0f MB) in %s", len(orphans), regions, size / 1e6, SHM_DIR)
    return Cleared(len(orphans), regions, size)
