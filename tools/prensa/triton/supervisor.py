"""Keep one tritonserver running under `prensa serve`.

A Triton that dies (OOM killer, a crashing backend, `kill -9`) is started again after a delay
that doubles with every quick failure in a row (1 s, 2 s, 4 s ... up to 30 s). A Triton that
stayed up for `healthy_after_s` counts as healthy again, so one crash a day never adds up to a
give-up; `limit` quick failures in a row (a repository that no longer loads, a port taken by
someone else) end `prensa serve` with a non-zero exit, for the service manager above to see.
Whether the first start works is the caller's business: a model that fails to load then is a
configuration error, reported at once, not retried. While Triton runs, a `StageWatch` reloads any
model whose Python-backend stub died.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry, Counter

from prensa.triton.healing import StageWatch
from prensa.triton.launcher import TritonProcess, TritonStartError

CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)
WATCH_INTERVAL_S = 0.5  # how often the stubs are looked at: a dead one is found within this
# Triton's error lines passed on per look; a flood of them is counted, not repeated
MAX_ERROR_LINES = 20


@dataclass(frozen=True)
class RestartPolicy:
    limit: int = 5  # quick failures in a row before giving up; 0: never restart
    backoff_s: float = 1.0  # delay before the first restart, doubled per quick failure in a row
    max_backoff_s: float = 30.0
    healthy_after_s: float = 60.0  # a Triton that ran this long resets the count and the delay

    def delay(self, failures: int) -> float:
        return cast(float, min(self.backoff_s * 2 ** (failures - 1), self.max_backoff_s))


class SupervisorMetrics:
    """What the supervisor did, for the gateway's /metrics (`GatewayMetrics.others`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.restarts = Counter(
            "prensa_triton_restarts",
            "Times tritonserver was started again after it died (or was stopped to heal it)",
            registry=self.registry,
        )
        self.reloads = Counter(
            "prensa_stage_reloads",
            "Models reloaded because a Python-backend stub died",
            ("model",),
            registry=self.registry,
        )


def shortened(lines: list[str], log_path: Path, last: bool = False) -> str:
    """At most MAX_ERROR_LINES of Triton's error lines (the first ones, or the `last`), the others counted."""
    more = len(lines) - MAX_ERROR_LINES
    if more <= 0:
        return "\n".join(lines)
    rest = f"... {more} more error lines in {log_path}"
    return "\n".join(
        [rest, *lines[-MAX_ERROR_LINES:]] if last else [*lines[:MAX_ERROR_LINES], rest]
    )


def describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class Supervisor:
    """Waits on a started, ready `TritonProcess` and restarts it per the policy until `stop()`."""

    def __init__(
        self,
        triton: TritonProcess,
        policy: RestartPolicy,
        say: Callable[[str], None],
        metrics: SupervisorMetrics | None = None,
    ) -> None:
        self.triton = triton
        self.policy = policy
        self.say = say
        self.metrics = metrics or SupervisorMetrics()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """No restart after this; Triton drains and exits. Safe in a signal handler (never waits)."""
        self._stopping.set()
        self.triton.terminate()

    def watch(self) -> int:
        """Wait for Triton to exit, healing its stages meanwhile; its exit code."""
        assert self.triton.process is not None
        stages = StageWatch(self.triton, self.say, self._stopping.is_set, self.metrics.reloads)
        stopped_at: float | None = None
        while True:
            try:
                return self.triton.process.wait(timeout=WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                if errors := self.triton.new_error_lines():
                    self.say_errors(errors.splitlines())
                if not self._stopping.is_set():
                    stages.check()
                    continue
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > self.triton.exit_deadline_s:
                    self.triton.reap_group()  # past its exit timeout: a dead stub holds it

    def say_errors(self, lines: list[str]) -> None:
        self.say("tritonserver logged:\n" + shortened(lines, self.triton.log_path))

    def run(self) -> int:
        """Supervise until `stop()` (0) or until the policy gives up (non-zero)."""
        assert self.triton.process is not None, "start Triton first"
        failures = 0
        started = time.monotonic()
        while True:
            code = self.watch()
            self.triton.reap_group()  # stubs of a killed Triton would live on beside the next one
            # stopped as asked, even if it took a SIGKILL past its exit timeout
            if self._stopping.is_set():
                if code not in CLEAN_EXITS:
                    self.say(f"tritonserver stopped ({describe_exit(code)})")
                return 0
            ran_s = time.monotonic() - started
            failures = 1 if ran_s >= self.policy.healthy_after_s else failures + 1
            kept = self.triton.log_path.with_name(self.triton.log_path.name + ".previous")
            errors = self.triton.error_lines()
            if self.triton.log_path.exists():
                self.triton.log_path.replace(kept)  # the next start writes a fresh log
            self.say(
                f"tritonserver died ({describe_exit(code)}) after {ran_s:.0f} s; its log: {kept}"
                + (f"\n{shortened(errors.splitlines(), kept, last=True)}" if errors else "")
            )
            if failures > self.policy.limit:
                self.say(
                    "not restarting tritonserver (restart limit 0)"
                    if self.policy.limit == 0
                    else f"giving up: tritonserver failed {failures} times in a row; no restart ran "
                    f"{self.policy.healthy_after_s:g} s"
                )
                return code if code > 0 else 1
            delay = self.policy.delay(failures)
            self.say(
                f"restarting tritonserver in {delay:g} s (quick failure {failures} of {self.policy.limit})"
            )
            if self._stopping.wait(delay):
                return 0
            started = time.monotonic()
            self.metrics.restarts.inc()
            try:
                self.triton.start()
                # a signal between the wait and the start: that Triton stops too
                if self._stopping.is_set():
                    self.triton.terminate()
                self.triton.wait_ready()
            except TritonStartError as exc:
                if not self._stopping.is_set():
                    self.say(f"tritonserver did not come back: {exc}")
                continue
            self.say(f"tritonserver is ready again (restart after {describe_exit(code)})")
