"""The chaos suite's counting: which lost numbers a broker passed over, and how they are told."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from redrive import headers as h

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _count() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("chaoslib.count")
    finally:
        sys.path.remove(str(BENCH))


count = _count()
RETRY = "t.g.retry.500ms"


def copy(number: int, attempt: int, partition: int, offset: int) -> Any:
    return count.Read(RETRY, partition, offset, str(number).encode(),
                      [(h.ATTEMPT, str(attempt).encode())])


def test_only_a_committed_copy_below_the_commit_never_handled_counts_as_passed_over() -> None:
    copies = [copy(1407, 1, 0, 51), copy(1407, 2, 0, 58),   # 2: never handled, below 60
              copy(7, 2, 1, 12),                              # at the commit: still to be read
              copy(8, 2, 0, 40),                              # handled at attempt 2
              copy(9, 1, 0, 41)]                              # handled at attempt 1
    handled = count.handled_attempts(["1407 0 t 0 350 fail 1 1.0", "1407 1 t 0 51 fail 2 2.0",
                                      "8 2 t 0 40 ok 2 3.0", "9 1 t 0 41 fail 2 3.0"])
    found = count.passed_over({1407, 7, 8, 9, 10}, copies, {0: 60, 1: 12}, handled)
    assert {n: (r.partition, r.offset) for n, r in found.items()} == {1407: (0, 58)}


def test_a_copy_with_no_readable_attempt_is_not_counted() -> None:
    bad = count.Read(RETRY, 0, 3, b"5", [(h.ATTEMPT, b"x")])
    assert count.passed_over({5}, [bad], {0: 10}, set()) == {}


def test_numbers_set_apart_leave_lost_and_are_named_in_a_note() -> None:
    outcome = count.Outcome("consumer SIGKILL x3 (2 members)", count.TRANSACTIONAL)
    outcome.tally({1: "ok", 2: "ok", 1407: "dead"}, count.Counter({1: 1}), count.Counter())
    assert (outcome.lost, outcome.lost_numbers) == (2, {2, 1407})
    outcome.set_apart({1407: copy(1407, 2, 0, 58)})
    assert (outcome.lost, outcome.passed_over, outcome.lost_numbers) == (1, 1, {2})
    assert outcome.failed  # number 2 is still lost
    assert "1407 at t.g.retry.500ms[0]@58" in outcome.notes[-1]
    assert "passed over by the broker 1" in outcome.line()
