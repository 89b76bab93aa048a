"""Keep every Python-backend stage of a supervised Triton alive.

Triton notices a dead stub only when a request reaches it (each such request waits a second and
fails), keeps reporting the model ready and never starts the stub again. `StageWatch` looks at the
stubs themselves: each one is a child process of tritonserver whose command line names its model
directory and its instance. When an instance's stub is gone, the model is unloaded at once (Triton
then reports it, and the ensembles using it, unavailable, so the gateway's /health names it and its
requests fail fast with 503) and loaded again, which starts a fresh stub and brings the ensembles
back with it. That takes explicit model-control mode; under any other mode, when the reload
fails, or when one model needs `MAX_RELOADS` reloads within `RELOAD_WINDOW_S` (a stub that crashes
again at once), the watch kills Triton and the supervisor starts it again, under its restart policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import tritonclient.http as httpclient
from prometheus_client import Counter

from prensa.triton.launcher import TritonProcess

STUB_BINARY = "triton_python_backend_stub"
# The stub's command line: binary, model file (<repo>/<model>/<version>/model.py), shared-memory
# region, sizes, parent pid, backend dir, IPC key, instance name ("<model>_<group>_<index>"), ...
MODEL_FILE_ARG, INSTANCE_ARG = 1, 8
RELOAD_TIMEOUT_S = 120.0
MAX_RELOADS, RELOAD_WINDOW_S = 3, 60.0


@dataclass(frozen=True)
class Stub:
    model: str
    instance: str
    alive: bool


def stub_of(process: psutil.Process) -> Stub | None:
    """The stage a stub process serves, or None for any other process."""
    try:
        argv = process.cmdline()
        alive = process.status() != psutil.STATUS_ZOMBIE  # Triton does not reap a stub that died
    except psutil.Error:
        return None
    if len(argv) <= INSTANCE_ARG or not argv[0].endswith(STUB_BINARY):
        return None
    return Stub(Path(argv[MODEL_FILE_ARG]).parent.parent.name, argv[INSTANCE_ARG], alive)


def live_instances(triton_pid: int) -> dict[str, set[str]]:
    """Per model, the instances whose stub runs now."""
    try:
        children = psutil.Process(triton_pid).children()
    except psutil.NoSuchProcess:
        return {}
    instances: dict[str, set[str]] = {}
    for stub in filter(None, map(stub_of, children)):
        if stub.alive:
            instances.setdefault(stub.model, set()).add(stub.instance)
    return instances


class StageWatch:
    """Compares the stubs of one ready Triton with those it started with; `check()` heals."""

    def __init__(
        self,
        triton: TritonProcess,
        say: Callable[[str], None],
        stopping: Callable[[], bool],
        reload_counter: Counter | None = None,
    ) -> None:
        assert triton.process is not None, "start Triton first"
        self.triton = triton
        self.pid = triton.process.pid
        self.say = say
        self.stopping = stopping  # once Triton is asked to stop, nothing is reloaded or restarted
        self.reload_counter = reload_counter  # per model, for /metrics
        self.expected = live_instances(self.pid)
        self.reloads: dict[str, list[float]] = {}  # per model, when it was reloaded

    def missing(self) -> dict[str, set[str]]:
        """Per model, the instances whose stub has died."""
        live = live_instances(self.pid)
        return {
            model: gone
            for model, instances in self.expected.items()
            if (gone := instances - live.get(model, set()))
        }

    def check(self) -> None:
        """Reload every model that lost a stub; restart Triton when that cannot be done."""
        for model, gone in self.missing().items():
            if self.stopping():
                return
            started = time.monotonic()
            recent = [at for at in self.reloads.get(model, []) if started - at < RELOAD_WINDOW_S]
            self.reloads[model] = recent
            reloadable = self.triton.options.reloadable and len(recent) < MAX_RELOADS
            self.say(
                f"the stub of {', '.join(sorted(gone))} died"
                + (f" ({len(recent) + 1} times in {RELOAD_WINDOW_S:g} s)" if recent else "")
                + "; "
                + ("reloading " + model if reloadable else "restarting tritonserver")
            )
            recent.append(started)
            phases = self.reload(model) if reloadable else None
            if phases is None:
                if not self.stopping():
                    self.triton.reap_group()  # the supervisor sees Triton exit and starts it again
                return
            if self.reload_counter is not None:
                self.reload_counter.labels(model).inc()
            self.say(
                f"{model} is serving again, {time.monotonic() - started:.1f} s after its stub was found dead "
                f"(unload {phases[0]:.1f} s, load {phases[1]:.1f} s)"
            )
        # a reload may start more instances
        for model, instances in live_instances(self.pid).items():
            self.expected.setdefault(model, set()).update(instances)

    def reload(self, model: str) -> tuple[float, float] | None:
        """Unload `model` (Triton reports it unavailable at once), then load it with fresh stubs; the
        seconds each took, or None when either failed."""
        client = httpclient.InferenceServerClient(
            self.triton.http_url, network_timeout=RELOAD_TIMEOUT_S
        )
        try:
            started = time.monotonic()
            client.unload_model(model)
            unloaded = time.monotonic()
            client.load_model(model)
        except Exception as exc:  # noqa: BLE001 - any failure: restart Triton instead
            if not self.stopping():
                self.say(f"reloading {model} failed ({exc}); restarting tritonserver")
            return None
        finally:
            client.close()
        return unloaded - started, time.monotonic() - unloaded
