"""What a Triton killed abruptly leaves behind is cleared, and nothing a live Triton uses: stand-ins
named as Triton and its stubs (copies of bash), regions as files in /dev/shm."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prensa.triton import leftovers


def named(tmp_path: Path, name: str) -> Path:
    """bash under another name: /proc/<pid>/comm and argv[0] say `name`."""
    copy = tmp_path / name
    shutil.copy(shutil.which("bash") or "/bin/bash", copy)
    return copy


@pytest.fixture
def regions() -> Iterator[dict[str, Path]]:
    made = {role: leftovers.SHM_DIR / f"{leftovers.REGION_PREFIX}test-{role}-{uuid.uuid4()}" for role in ("dead", "live")}
    for path in made.values():
        path.write_bytes(b"\0" * 4096)
    yield made
    for path in made.values():
        path.unlink(missing_ok=True)


def test_orphaned_stubs_and_abandoned_regions_go_and_a_live_tritons_stay(tmp_path, regions):
    stub, triton = named(tmp_path, leftovers.STUB_NAME), named(tmp_path, leftovers.TRITON_NAME)
    # A live "Triton" holding its region open, with its stub; and a stub whose Triton is gone.
    live = subprocess.Popen([str(triton), "-c", f'exec 3<"{regions["live"]}"; "{stub}" -c "sleep 60; :" & wait'],
                            start_new_session=True)
    orphan = subprocess.Popen([str(stub), "-c", "sleep 60; :"])  # "; :" keeps bash from exec-ing sleep
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(live.pid).children():
            assert time.monotonic() < deadline, "the stand-in Triton did not start its stub"
            time.sleep(0.02)
        live_stub = psutil.Process(live.pid).children()[0]
        assert orphan.pid in {p.pid for p in leftovers.orphaned_stubs()}
        assert live_stub.pid not in {p.pid for p in leftovers.orphaned_stubs()}

        cleared = leftovers.clear(stale_after_s=0)

        assert not psutil.pid_exists(orphan.pid)  # killed and reaped (`clear` waits for it)
        assert live_stub.is_running() and live.poll() is None
        assert not regions["dead"].exists() and regions["live"].exists()
        assert cleared.stubs >= 1 and cleared.regions >= 1 and cleared.region_bytes >= 4096
    finally:
        orphan.kill()
        subprocess.run(["pkill", "-KILL", "-s", str(live.pid)], check=False)  # the stand-in and its stub
        live.wait(timeout=5)


def test_a_young_region_is_left_alone(regions):
    leftovers.clear()  # the default age: a region made a moment ago may be a starting Triton's
    assert regions["dead"].exists()
