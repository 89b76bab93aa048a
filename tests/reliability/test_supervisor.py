"""The supervisor's counting, with short-lived stand-in processes instead of Triton (tests/reliability/
test_faults.py runs it on a real one): delays double per quick failure, a run longer than
`healthy_after_s` resets the count, `limit` quick failures in a row give up, `stop()` ends it."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from prensa.triton.launcher import TritonOptions, TritonProcess
from prensa.triton.supervisor import MAX_ERROR_LINES, RestartPolicy, Supervisor, SupervisorMetrics


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
        self._log_read = 0
        self.log_path.write_text(f"E0101 00:00:00.000000 1 server.cc:1] run {self.starts} failed\n")
        self.process = subprocess.Popen(["sleep", str(self.seconds)])

    new_error_lines = TritonProcess.new_error_lines

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


def test_tritons_new_errors_reach_prensas_log_and_restarts_are_counted(tmp_path):
    """Error lines Triton writes while it runs are passed on (CPU-only noise and other lines are not,
    a flood is cut short); each restart counts in prensa_triton_restarts_total."""
    said: list[str] = []
    triton = StandIn(tmp_path / "triton.log", seconds=4)
    metrics = SupervisorMetrics()
    supervisor = Supervisor(triton, RestartPolicy(limit=1, backoff_s=0.01, healthy_after_s=60), said.append, metrics)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    while not any("run 1 failed" in s for s in said):  # what the log held when watching began
        thread.join(0.05)
    with triton.log_path.open("a") as log:
        log.write("I0101 00:00:01.000000 1 model.cc:2] loaded\n"
                  "E0101 00:00:01.000000 1 pb_stub.cc:3] Failed to process the request(s) for model 'minilm_pool'\n"
                  "E0101 00:00:01.000000 1 metrics.cc:4] Unable to get CUDA device count\n"
                  "E0101 00:00:01.000000 1 pb_stub.cc:3] half a line")  # not yet ended: not read yet
    while not any("minilm_pool" in s for s in said):
        thread.join(0.05)
        assert thread.is_alive(), said
    (surfaced,) = [s for s in said if "minilm_pool" in s]
    assert triton.starts == 1, said
    assert surfaced.startswith("tritonserver logged:\n") and "loaded" not in surfaced and "CUDA" not in surfaced
    assert "half a line" not in surfaced
    with triton.log_path.open("a") as log:
        log.write("".join(f" {i}\nE0101 00:00:02.000000 1 pb_stub.cc:3] flood {i}" for i in range(50)) + "\n")
    while not any("flood" in s for s in said):
        thread.join(0.05)
    (flood,) = [s for s in said if "flood" in s]
    assert triton.starts == 1, said
    assert "half a line 0" in flood and flood.count("flood") == MAX_ERROR_LINES - 1
    assert f"... {51 - MAX_ERROR_LINES} more error lines in {triton.log_path}" in flood
    while triton.starts < 2:
        thread.join(0.05)
    supervisor.stop()
    thread.join(5)
    (died,) = [s for s in said if "died" in s]  # the log's last error lines, the earlier ones counted
    assert "flood 49" in died and "minilm_pool" not in died and "more error lines in" in died
    assert metrics.registry.get_sample_value("prensa_triton_restarts_total") == 1
