"""What one gateway worker does about the others (`prensa.gateway.workers`): the permits they share
turn its requests away when the others hold them all, and the default count fits the host."""

from __future__ import annotations

import multiprocessing

import pytest

from prensa.gateway.core.limits import SharedPermits
from prensa.gateway.settings import GatewaySettings, InvalidSetting
from prensa.gateway.workers import available_cores, worker_count
from tests.fast.conftest import gateway_client


def test_permits_held_by_another_worker_turn_requests_away(settings):
    counts = multiprocessing.get_context("spawn").Array("q", 2)
    counts[1] = settings.max_concurrent_requests  # the other worker holds every permit
    with gateway_client(settings, shared_permits=SharedPermits(counts, 0)) as http:
        refused = http.post("/embed", json={"inputs": "dog"})
        assert refused.status_code == 429, refused.text
        counts[1] = settings.max_concurrent_requests - 1  # one left: a one-input request fits, a two-input one not
        assert http.post("/embed", json={"inputs": "dog"}).status_code == 200
        assert http.post("/embed", json={"inputs": ["dog", "fox"]}).status_code == 429
    assert counts[0] == 0  # this worker gave back what it took


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (4, 1), (7, 1), (8, 2), (16, 4), (64, 16)])
def test_the_default_is_one_worker_per_four_cores(cores, workers):
    assert worker_count(GatewaySettings(), cores) == workers
    assert worker_count(GatewaySettings(workers=3), cores) == 3


def test_no_workers_is_refused():
    with pytest.raises(InvalidSetting, match="must be positive"):
        GatewaySettings(workers=0)


@pytest.mark.parametrize(("cpu_max", "cap"), [("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000", 1),
                                             ("max 100000\n", None), (None, None)])
def test_a_containers_cpu_limit_caps_the_cores(tmp_path, cpu_max, cap):
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    unlimited = available_cores(tmp_path / "absent")
    assert available_cores(path) == (min(unlimited, cap) if cap else unlimited)
