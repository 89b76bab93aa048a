"""The supervisor's counting, with short-lived stand-in processes instead of Triton (tests/reliability/
test_faults.py runs it on a real one): delays double per quick failure, a run longer than
`healthy_after_s` resets the count, `limit` quick failures in a row give up, `stop()` ends it."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from prensa.triton.launcher import TritonOptions
from prensa.triton.supervisor import RestartPolicy, Supervisor


class StandIn:
    """What the supervisor uses of a TritonProcess, running `sleep SECONDS` instead."""

    def __init__(self, log_path: Path, seconds: float) -> None:
        self.log_path, self.seconds, self.starts = log_path, seconds, 0
        self.options = TritonOptions(log_path.parent)
        self.exit_deadline_s = self.options.exit_timeout_s + 1.0
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.log_path.write_text(f"E0101 00:00:00.000000 1 server.cc:1] run {self.starts} failed\n")
        self.process = subprocess.Popen(["sleep", str(self.seconds)])

    def wait_ready(self) -> None:
        pass

    def error_lines(self) -> str:
        return self.log_path.read_text()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def reap_group(self) -> None:
        pass  # `sleep` starts no children


def test_backoff_doubles_up_to_its_ceiling():
    policy = RestartPolicy(backoff_s=1.0, max_backoff_s=30.0)
    assert [policy.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_quick_failures_in_a_row_give_up(tmp_path):
    said: list[str] = []
    triton = StandIn(tmp_path / "triton.log", seconds=0)
    policy = RestartPolicy(limit=3, backoff_s=0.01, healthy_after_s=60)
    assert Supervisor(triton, policy, said.append).run() == 1  # `sleep` exits 0: not a code to pass on
    assert triton.starts == 4  # the first start and three restarts
    assert [s.split(" (")[0] for s in said if s.startswith("restarting")] == [
        "restarting tritonserver in 0.01 s", "restarting tritonserver in 0.02 s", "restarting tritonserver in 0.04 s"]
    assert "giving up: tritonserver failed 4 times in a row" in said[-1]
    assert "run 4 failed" in said[-2] and (tmp_path / "triton.log.previous").read_text().endswith("run 4 failed\n")


def test_a_healthy_run_resets_the_count_and_stop_ends_it(tmp_path):
    said: list[str] = []
    triton = StandIn(tmp_path / "triton.log", seconds=0.3)
    supervisor = Supervisor(triton, RestartPolicy(limit=1, backoff_s=0.01, healthy_after_s=0.2), said.append)
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(supervisor.run()))
    thread.start()
    while triton.starts < 4:  # limit 1, yet it keeps restarting: every run outlived healthy_after_s
        thread.join(0.05)
        assert thread.is_alive(), said
    supervisor.stop()
    thread.join(5)
    assert outcome == [0] and not any("giving up" in s for s in said)
    assert all("quick failure 1 of 1" in s for s in said if s.startswith("restarting"))
