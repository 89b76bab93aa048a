"""The encoder's token counters: sent off the request path, coalesced, and none lost at close."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from prensa.stages import load_stage

encode = load_stage("encode")


class RecordingMetric:
    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []

    def increment(self, value: float) -> None:
        self.calls.append((value, threading.current_thread().name))


class RecordingFamily:
    COUNTER = "counter"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.metric = RecordingMetric()

    def Metric(self, labels: dict[str, str]) -> RecordingMetric:  # noqa: N802 - pb_utils' name
        return self.metric


@pytest.fixture
def counters(monkeypatch):
    monkeypatch.setattr(encode, "pb_utils", SimpleNamespace(MetricFamily=RecordingFamily))
    # A window far longer than the loop below, so every block lands in the first flush.
    monkeypatch.setattr(encode.TokenCounters, "FLUSH_DELAY_S", 0.5)
    return encode.TokenCounters("m")


def test_counts_are_sent_once_per_window_from_the_flusher_thread(counters):
    encoder = SimpleNamespace(real_tokens=0, padded_tokens=0)
    for real, padded in [(3, 4), (10, 12), (7, 7)]:
        with counters.counting(encoder):
            encoder.real_tokens += real
            encoder.padded_tokens += padded
    counters.close()
    real, padded = counters.metrics["real"].calls, counters.metrics["padded"].calls
    assert [value for value, _ in real] == [20] and [value for value, _ in padded] == [23]
    assert {thread for _, thread in real + padded} == {"prensa-token-counters"}


def test_close_sends_what_arrived_during_the_last_flush(monkeypatch):
    gate, inside = threading.Event(), threading.Event()

    class SlowMetric(RecordingMetric):
        def increment(self, value: float) -> None:
            inside.set()
            gate.wait()  # the round trip to Triton, held open
            super().increment(value)

    monkeypatch.setattr(RecordingFamily, "Metric", lambda self, labels: SlowMetric())
    monkeypatch.setattr(encode, "pb_utils", SimpleNamespace(MetricFamily=RecordingFamily))
    monkeypatch.setattr(encode.TokenCounters, "FLUSH_DELAY_S", 0.01)
    counters = encode.TokenCounters("m")
    encoder = SimpleNamespace(real_tokens=0, padded_tokens=0)
    with counters.counting(encoder):
        encoder.real_tokens, encoder.padded_tokens = 5, 5
    assert inside.wait(5)
    with counters.counting(encoder):  # the last execute, while the flusher is mid-send
        encoder.real_tokens, encoder.padded_tokens = 7, 8
    closer = threading.Thread(target=counters.close)
    closer.start()
    while not counters._closing:
        closer.join(0.001)
    gate.set()
    closer.join(5)
    assert not closer.is_alive()
    assert sum(v for v, _ in counters.metrics["real"].calls) == 7
    assert sum(v for v, _ in counters.metrics["padded"].calls) == 8
