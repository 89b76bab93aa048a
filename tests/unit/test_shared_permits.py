"""`SharedPermits` across processes: what one process holds counts against the others' capacity."""

from __future__ import annotations

import multiprocessing

from prensa.gateway.core.limits import SharedPermits


def within_four(held: int, count: int) -> bool:
    return held + count <= 4


def hold_three(counts, taken, release) -> None:
    permits = SharedPermits(counts, 1)
    assert permits.take(3, within_four)
    taken.set()
    release.wait(30)
    permits.add(-3)


def test_permits_taken_in_another_process_count_against_this_ones():
    spawn = multiprocessing.get_context("spawn")
    counts, taken, release = spawn.Array("q", 2), spawn.Event(), spawn.Event()
    other = spawn.Process(target=hold_three, args=(counts, taken, release))
    other.start()
    assert taken.wait(60)
    mine = SharedPermits(counts, 0)
    assert not mine.take(2, within_four)  # 3 held over there
    assert mine.take(1, within_four)
    release.set()
    other.join(30)
    assert other.exitcode == 0
    assert mine.take(3, within_four) and list(counts) == [4, 0]
