"""`prensa loadtest heal`'s report of one kill: healed from the kill to the first request sent after
the last failure and after the kill that was answered, never a negative time."""

from __future__ import annotations

from prensa.bench.heal import Outcomes, report

KILL = 100.0


def healed_line(rows: list[tuple[float, float, str, int | str, str | None]]) -> str:
    lines = report(KILL, KILL + 10, "embeddings", Outcomes(rows), None)
    return next(line for line in lines if "healed" in line or "none failed" in line)


def test_a_failure_in_flight_at_the_kill_is_healed_by_a_request_sent_after_the_kill():
    rows = [(99.0, 100.5, "embeddings", 503, "3"),  # in flight at the kill, failed after it
            (99.5, 100.2, "embeddings", 200, None),  # sent later, before the kill: no news of the heal
            (101.2, 101.3, "embeddings", 200, None)]
    assert "healed in 1.20 s" in healed_line(rows)


def test_failures_after_the_kill_heal_at_the_first_answer_sent_after_the_last_of_them():
    rows = [(100.1, 100.2, "embeddings", 503, "3"), (101.0, 101.1, "embeddings", 503, "3"),
            (101.5, 101.6, "embeddings", 200, None), (102.0, 102.1, "embeddings", 200, None)]
    assert "healed in 1.50 s" in healed_line(rows)
    assert "not healed" in healed_line(rows[:2])
    assert "none failed" in healed_line(rows[2:])
