"""`prensa bench changes` counts a change's wrong answers from when each was asked and answered:
the promotion's answers asked after it returned must be the new version's, those that ended before
it began the old one's, and a request that overlaps the next change is not judged."""

from __future__ import annotations

from prensa.bench.changes import Answer, Change, figures

PROMOTION = Change("promote m@2", began=10.0, returned=10.1, before="1", after="2")


def test_answers_from_the_wrong_side_of_a_promotion_are_counted():
    answers = [
        Answer(6.0, 6.2, 200, "1"),  # before it: the old version
        Answer(9.9, 10.05, 200, "1"),  # during it: either
        Answer(10.0, 10.2, 200, "2"),
        Answer(10.3, 10.5, 200, "2"),  # after it: the new version
        Answer(10.4, 10.6, 200, "1"),  # wrong
        Answer(7.0, 7.1, 200, "2"),  # wrong
        Answer(15.9, 16.5, 200, "1"),  # reaches past the next change (at 16.1): not judged
        Answer(12.0, 12.1, 503, ""),
    ]
    row = figures(PROMOTION, answers, steady_s=5.0)
    assert (row.wrong_version, row.failed) == (2, 1)
    assert 150.0 < row.p99_before_ms <= 200.0  # of the three asked in the spell before it
