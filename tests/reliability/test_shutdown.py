"""Stopping `prensa serve`: SIGTERM under load, with a dead stage or with a client sending its body
a byte a second exits 0 within the grace period (`GRACE_S`) plus `SLACK_S`, leaving no process
behind; SIGKILL of prensa takes Triton and its stubs with it; a start that finds Triton's ports held
by such a leftover says who holds them instead of serving through it. `prensa bench` stopped either
way takes its own Triton and gateway with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import psutil
import pytest

from prensa.addresses import free_port
from prensa.triton import leftovers
from prensa.triton.launcher import TritonOptions, TritonPorts, TritonProcess
from prensa.triton.repo import ServingOptions
from tests.reliability.conftest import build_repo, stop_tree, wait_until
from tests.reliability.test_faults import PRENSA, Serve
from tests.reliability.test_healing import TEXT, kill_stub

pytestmark = pytest.mark.triton
GRACE_S = 3.0
SLACK_S = 8.0  # process exits, Triton's own drain and the stubs noticing it, on a busy 2-core machine


@pytest.fixture(scope="module")
def repo(tmp_path_factory, exports):
    return build_repo(exports, ["minilm"], tmp_path_factory.mktemp("shutdown") / "repo", ServingOptions())


def started(repo, tmp_path) -> tuple[Serve, list[psutil.Process]]:
    serve = Serve(repo, tmp_path / "serve.log", "--graceful-timeout", str(GRACE_S))
    serve.wait_healthy(120)
    return serve, psutil.Process(serve.process.pid).children(recursive=True)


def stop_within(serve: Serve, family: list[psutil.Process], sig: int = signal.SIGTERM) -> tuple[int, float]:
    """Send `sig`, wait for prensa to exit and for every process it started to be gone; (code, seconds)."""
    sent = time.monotonic()
    serve.process.send_signal(sig)
    code = serve.process.wait(timeout=GRACE_S + SLACK_S + 30)
    wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family),
               GRACE_S + SLACK_S, "every process of prensa gone")
    return code, time.monotonic() - sent


def assert_clean_exit(serve: Serve, family: list[psutil.Process], what: str) -> None:
    """SIGTERM: exit 0 within the grace period and the slack, every process gone."""
    code, seconds = stop_within(serve, family)
    print(f"\nSIGTERM {what}: exit {code} after {seconds:.1f} s")
    assert code == 0, serve.output()
    assert seconds < GRACE_S + SLACK_S


def test_sigterm_under_load(repo, tmp_path):
    serve, family = started(repo, tmp_path)
    try:
        statuses: list[int | str] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=serve.url, timeout=30) as client:
                while not stop.is_set():
                    try:
                        statuses.append(client.post("/embed", json={"inputs": [TEXT] * 8}).status_code)
                    except httpx.TransportError:  # the listener is closed: no new connection
                        statuses.append("refused")
                        time.sleep(0.05)

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        try:
            assert_clean_exit(serve, family, "under load")
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)
        assert 200 in statuses and set(statuses) <= {200, 503, "refused"}, set(statuses)
    finally:
        stop_tree(serve.process)


def test_sigterm_with_a_dead_stage(repo, tmp_path):
    serve, family = started(repo, tmp_path)
    try:
        kill_stub(serve.triton_pid(), "minilm_encode")
        assert_clean_exit(serve, family, "with a dead stage")
    finally:
        stop_tree(serve.process)


def test_sigterm_with_a_slow_client(repo, tmp_path):
    serve, family = started(repo, tmp_path)
    try:
        host, port = serve.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        stop = threading.Event()

        def trickle() -> None:  # one byte a second, for longer than the test lasts
            while not stop.wait(1.0):
                try:
                    sock.send(b" ")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(1.5)
        try:
            assert_clean_exit(serve, family, "with a slow client")
        finally:
            stop.set()
            sock.close()
    finally:
        stop_tree(serve.process)


def test_sigkill_takes_triton_along(repo, tmp_path):
    serve, family = started(repo, tmp_path)
    try:
        assert serve.triton_pid() is not None and len(family) > 2, "Triton and its stubs"
        code, seconds = stop_within(serve, family, signal.SIGKILL)
        print(f"\nSIGKILL of prensa: Triton and {len(family) - 1} stubs gone {seconds:.1f} s later")
        assert code == -signal.SIGKILL
    finally:
        for process in family:  # a failed test must not leave them either
            if process.is_running():
                process.kill()
        stop_tree(serve.process)


def command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_bench_stopped_while_it_measures_leaves_nothing_running(tmp_path, exports, sig):
    """`prensa bench` starts a Triton and a gateway of its own. SIGTERM while it measures through the
    gateway: it stops both the orderly way and exits 143; SIGKILL: both die with it."""
    with (tmp_path / "bench.log").open("wb") as log:
        bench = subprocess.Popen([PRENSA, "bench", str(exports["minilm"]), "--out", str(tmp_path / "out"),
                                  "--no-peers", "--pipeline", "fused", "--texts", "400", "--concurrency", "1"],
                                 stdout=log, stderr=subprocess.STDOUT)
    try:
        def family() -> list[psutil.Process]:
            return psutil.Process(bench.pid).children(recursive=True)

        # `prensa gateway` runs as `python .../prensa gateway ...` (the script's interpreter first).
        wait_until(lambda: any("gateway" in command_line(p)[1:3] for p in family()), 300, "the bench's gateway")
        processes = family()
        assert len(processes) > 2, "Triton, its stub and the gateway"
        bench.send_signal(sig)
        code = bench.wait(timeout=60)
        wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes), 30,
                   "every process of the bench gone")
        output = (tmp_path / "bench.log").read_text(errors="replace")
        assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL), output
        if sig == signal.SIGTERM:  # Triton was asked to stop, not killed by its parent-death signal
            assert "successfully unloaded" in (tmp_path / "out" / "tritonserver-fused.log").read_text()
    finally:
        stop_tree(bench)


def test_ports_held_by_a_leftover_triton_are_named(repo, tmp_path):
    ports = TritonPorts(free_port(), free_port(), free_port())
    with TritonProcess(TritonOptions(repo, ports=ports), log_path=tmp_path / "leftover.log") as leftover:
        run = subprocess.run([PRENSA, "serve", "--repo", str(repo), "--http-port", str(ports.http),
                              "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics),
                              "--gateway-port", str(free_port())], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1
        said = " ".join((run.stdout + run.stderr).split())
        assert f"port 127.0.0.1:{ports.http} is taken by tritonserver (pid {leftover.process.pid})" in said, said
        assert "Triton is ready" not in said


def stub_regions(triton: TritonProcess) -> set[str]:
    """The /dev/shm regions of `triton`'s Python-backend stubs, from their command lines."""
    assert triton.process is not None
    return {arg for stub in psutil.Process(triton.process.pid).children() for arg in stub.cmdline()
            if arg.startswith(leftovers.REGION_PREFIX)}


def test_the_regions_of_a_killed_triton_are_cleared_and_a_live_ones_kept(repo, tmp_path):
    def triton(name: str) -> TritonProcess:
        ports = TritonPorts(free_port(), free_port(), free_port())
        return TritonProcess(TritonOptions(repo, ports=ports), log_path=tmp_path / f"{name}.log")

    with triton("live") as live, triton("killed") as killed:
        kept, dropped = stub_regions(live), stub_regions(killed)
        assert kept and dropped, "each Triton's stubs have their regions"
        assert killed.process is not None
        os.killpg(killed.process.pid, signal.SIGKILL)  # Triton and stubs at once: nobody unlinks a region
        killed.process.wait(timeout=10)
        wait_until(lambda: not leftovers.regions_in_use() & dropped, 10, "the killed stubs' mappings gone")
        assert all((leftovers.SHM_DIR / name).exists() for name in dropped), "leaked, as Triton leaves them"
        leftovers.clear(stale_after_s=0)  # the next start clears them once 30 s old
        assert not any((leftovers.SHM_DIR / name).exists() for name in dropped)
        assert all((leftovers.SHM_DIR / name).exists() for name in kept)
        assert httpx.get(f"http://{live.http_url}/v2/health/ready").status_code == 200
