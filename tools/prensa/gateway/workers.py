"""Several gateway processes serving one port (`--workers N`).

One Python process answers one request at a time on one core, which on a GPU host caps a whole
deployment's short queries (TEI's router and vLLM's API server spread requests over cores too).
`WorkerPool` binds the listening socket once and spawns N workers (fresh interpreters: nothing
forked from a parent that runs threads), each a whole gateway (app, Triton channels, merger)
accepting on that socket. What clients and operators rely on holds across them:

- admission: --max-concurrent-requests bounds the workers together (`limits.SharedPermits`: one
  slot per worker in shared memory), and past it every worker answers 429;
- metrics: prometheus-client's multiprocess mode: each worker keeps its series in files of one
  directory, and any worker's /metrics sums them all (TEI's counters then show as gauges);
- a worker that dies is logged and replaced (its slot of permits emptied, its live gauges
  dropped); one that never starts (a taken port, an unserved --default-model) stops the pool;
- SIGTERM or SIGINT stops every worker, each draining within --graceful-timeout as one process
  does; the signal is then raised again for whoever runs the pool (`prensa serve` stops Triton).
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from prensa.gateway.core.limits import SharedPermits
from prensa.gateway.logs import configure_logging
from prensa.gateway.metrics import MULTIPROCESS_DIR
from prensa.gateway.server import run_server, worker_server
from prensa.gateway.settings import GatewaySettings
from prensa.triton.supervisor import describe_exit

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from prometheus_client import CollectorRegistry

    from prensa.gateway.backends.base import BackendFactory
    from prensa.gateway.server import Serving

log = logging.getLogger("prensa.gateway")

CORES_PER_WORKER = 4  # the default: one worker per this many cores, at least one
# a worker's exit code when its server did not start (uvicorn's own for a failed start-up)
NEVER_STARTED = 3
QUICK_DEATH_S = 5.0  # a worker that dies younger than this is replaced after a pause, not at once
REPLACE_PAUSE_S = 1.0
STOP_MARGIN_S = 5.0  # beyond --graceful-timeout, before a worker still running is killed
SIGNALS = (signal.SIGTERM, signal.SIGINT)


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD", or "max PERIOD"


def available_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may use: its CPU affinity, capped by a container's CPU limit (a pod
    limited to 2 CPUs on a 64-core node gets 2, not 64)."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def worker_count(settings: GatewaySettings, cores: int | None = None) -> int:
    """`--workers`, or one per CORES_PER_WORKER cores of this host, at least one."""
    if settings.workers is not None:
        return settings.workers
    return max(1, (cores if cores is not None else available_cores()) // CORES_PER_WORKER)


_shared: Path | None = None  # where `share_metrics` keeps this process's series


def share_metrics() -> tuple[Path, bool]:
    """Keep this process's prometheus-client series, and its children's, in multiprocess files
    under $PROMETHEUS_MULTIPROC_DIR (an operator's, emptied of an earlier run's files, else a new
    temporary directory), so every worker's /metrics includes them: `prensa serve` calls it before
    its supervisor's counters are made. The directory, and whether this call created it (it is
    removed at exit); later calls return the same directory."""
    global _shared
    if _shared is not None:
        return _shared, False
    from prometheus_client import values

    given = os.environ.get(MULTIPROCESS_DIR)
    if given:  # prometheus-client read it when imported: this process's series already go there
        directory = Path(given)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
    else:
        directory = Path(tempfile.mkdtemp(prefix="prensa-metrics-"))
        atexit.register(shutil.rmtree, directory, True)
        os.environ[MULTIPROCESS_DIR] = str(directory)
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]  # series made from now on
    _shared = directory
    return directory, not given


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound and listening, inheritable by the workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # uvicorn's default backlog
    sock.set_inheritable(True)
    return sock


def serve_worker(
    settings: GatewaySettings,
    host: str,
    port: int,
    sock: socket.socket,
    slot: int,
    counts: Any,
    backend: BackendFactory | None,
) -> None:
    """A worker process's life: one gateway on the shared socket, permits in slot `slot` of `counts`."""
    configure_logging(settings.log_level, settings.json_output)
    server = worker_server(
        settings, host, port, backend=backend, shared_permits=SharedPermits(counts, slot)
    )
    if not run_server(server, sockets=[sock]):
        sys.exit(NEVER_STARTED)


@dataclass
class Worker:
    slot: int
    process: BaseProcess
    started_at: float


class WorkerPool:
    """`count` gateway workers on one port, supervised (see the module docstring); `run()` blocks
    until a signal, `should_exit`, or a worker that cannot start. uvicorn.Server's interface, so
    `server.run_server` runs either."""

    def __init__(
        self, settings: GatewaySettings, host: str, port: int, backend: BackendFactory | None = None
    ) -> None:
        self.settings, self.host, self.port, self.backend = settings, host, port, backend
        self.count = worker_count(settings)
        self.should_exit = False
        self.started = False
        # the one that stopped the pool, raised again once the workers are down
        self.signal: int | None = None
        self.context = multiprocessing.get_context("spawn")
        self.counts: Any = self.context.Array("q", self.count)  # permits held, per slot
        self.workers: dict[int, Worker] = {}

    def _start(self, slot: int, sock: socket.socket) -> None:
        self.counts[slot] = 0  # what a dead worker held is nobody's now
        process = self.context.Process(
            target=serve_worker,
            name=f"prensa-gateway-{slot}",
            daemon=False,
            args=(self.settings, self.host, self.port, sock, slot, self.counts, self.backend),
        )
        process.start()
        self.workers[slot] = Worker(slot, process, time.monotonic())

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum
        self.should_exit = True

    def run(self) -> None:
        directory, created = share_metrics()
        try:
            sock = listening_socket(self.host, self.port)
        except OSError as exc:
            log.error("the gateway cannot listen on %s:%d: %s", self.host, self.port, exc)
            return
        previous = {signum: signal.signal(signum, self._on_signal) for signum in SIGNALS}
        try:
            for slot in range(self.count):
                self._start(slot, sock)
            log.info("gateway: %d worker processes on %s:%d", self.count, self.host, self.port)
            self.started = True
            self.started = self._supervise(sock)  # False: a worker could not start
        finally:
            self._stop()
            sock.close()
            self.counts = None  # its semaphore is released now, not reported leaked at exit
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if created:  # the signal raised below may end this process before atexit runs
                shutil.rmtree(directory, ignore_errors=True)
        if self.signal is not None:  # as uvicorn does: whoever runs the pool sees the signal too
            signal.raise_signal(self.signal)

    def _supervise(self, sock: socket.socket) -> bool:
        """Replace workers that die until told to stop; False when one could not start."""
        from prometheus_client import multiprocess

        while not self.should_exit:
            by_sentinel = {worker.process.sentinel: worker for worker in self.workers.values()}
            for sentinel in wait(list(by_sentinel), timeout=0.5):
                worker = by_sentinel[sentinel]  # type: ignore[index]
                worker.process.join()
                code, pid = worker.process.exitcode, worker.process.pid
                if self.should_exit:
                    break
                if code == NEVER_STARTED:
                    log.error(
                        "gateway worker %d did not start (its log is above); stopping the gateway",
                        worker.slot,
                    )
                    return False
                multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
                lived = time.monotonic() - worker.started_at
                log.warning(
                    "gateway worker %d (pid %s) ended with %s after %.0f s; starting another",
                    worker.slot,
                    pid,
                    describe_exit(code or 0),
                    lived,
                )
                if lived < QUICK_DEATH_S:
                    time.sleep(REPLACE_PAUSE_S)
                self._start(worker.slot, sock)
        return True

    def _stop(self) -> None:
        """SIGTERM to every worker (each drains as one gateway does), SIGKILL to any still running after
        --graceful-timeout and a margin."""
        for worker in self.workers.values():
            if worker.process.is_alive():
                os.kill(worker.process.pid or 0, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.graceful_timeout_s + STOP_MARGIN_S
        for worker in self.workers.values():
            worker.process.join(max(deadline - time.monotonic(), 0.0))
            if worker.process.is_alive():
                log.warning("gateway worker %d did not stop in time; killing it", worker.slot)
                worker.process.kill()
                worker.process.join()


def gateway_server(
    settings: GatewaySettings,
    host: str,
    port: int,
    other_metrics: Sequence[CollectorRegistry] = (),
    backend: BackendFactory | None = None,
) -> Serving:
    """The gateway on host:port: one uvicorn server (`GatewayServer`), or a pool of worker
    processes each running one (`settings.workers`, see `workers.worker_count`). `run()` blocks,
    `should_exit = True` stops it, giving in-flight requests `graceful_timeout_s` before cancelling
    them. Connections are this module's protocol: read and write timeouts, header and connection
    limits. `other_metrics` join the gateway's own on its /metrics (with workers, only series kept
    in prometheus-client's multiprocess files reach it: `workers.share_metrics`); `backend` is
    `create_app`'s (default: the Tritons of the settings), picklable when there are workers."""
    if worker_count(settings) > 1:
        return WorkerPool(settings, host, port, backend)
    return worker_server(settings, host, port, other_metrics, backend)
