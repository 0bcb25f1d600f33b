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


def test_only_a_copy_never_handled_behind_an_abort_in_its_partition_counts_as_passed_over(
        ) -> None:
    copies = [copy(1407, 1, 0, 51), copy(1407, 2, 0, 58),   # 2: never handled, abort at 45
              copy(7, 2, 1, 12),                              # partition 1: no abort
              copy(8, 2, 0, 40),                              # handled at attempt 2
              copy(9, 1, 0, 41),                              # handled at attempt 1
              copy(11, 1, 2, 30)]                             # its partition's abort comes later
    handled = count.handled_attempts(["1407 0 t 0 350 fail 1 1.0", "1407 1 t 0 51 fail 2 2.0",
                                      "8 2 t 0 40 ok 2 3.0", "9 1 t 0 41 fail 2 3.0"])
    found = count.passed_over({1407, 7, 8, 9, 10, 11}, copies, handled,
                              {0: [46, 45], 2: [31]})
    assert {n: (r.partition, r.offset) for n, r in found.items()} == {1407: (0, 58)}


def test_only_copies_a_reader_starting_at_them_does_not_get_stay_passed_over() -> None:
    """An abort earlier in the partition excuses only the copies it hides: those of the
    producer that aborted. Another producer's copy, never handled, is a loss of redrive's."""
    found = {1: copy(1, 1, 0, 50), 2: copy(2, 1, 0, 52), 3: copy(3, 1, 1, 9)}
    asked: list[tuple[int, int]] = []

    def visible(partition: int, start: int) -> set[int]:
        asked.append((partition, start))
        return {52} if partition == 0 else set()

    assert count.hidden(found, visible) == {1: found[1], 3: found[3]}
    assert sorted(asked) == [(0, 50), (1, 9)]


def test_a_copy_with_no_readable_attempt_is_not_counted() -> None:
    bad = count.Read(RETRY, 0, 3, b"5", [(h.ATTEMPT, b"x")])
    assert count.passed_over({5}, [bad], set(), {0: [1]}) == {}


def test_numbers_set_apart_leave_lost_and_are_named_in_a_note() -> None:
    outcome = count.Outcome("consumer SIGKILL x3 (2 members)", count.TRANSACTIONAL)
    outcome.tally({1: "ok", 2: "ok", 1407: "dead"}, count.Counter({1: 1}), count.Counter())
    assert (outcome.lost, outcome.lost_numbers) == (2, {2, 1407})
    outcome.set_apart({1407: copy(1407, 2, 0, 58)})
    assert (outcome.lost, outcome.passed_over, outcome.lost_numbers) == (1, 1, {2})
    assert outcome.failed  # number 2 is still lost
    assert "1407 at t.g.retry.500ms[0]@58" in outcome.notes[-1]
    assert "passed over by the broker 1" in outcome.line()


def test_stuck_numbers_set_apart_leave_stuck_and_are_named_in_a_note() -> None:
    outcome = count.Outcome("consumer SIGKILL x3 (2 members)", count.TRANSACTIONAL)
    outcome.tally({1: "ok", 2: "ok", 3: "ok"}, count.Counter({1: 1}), count.Counter(),
                  in_flight={2, 3})
    assert (outcome.stuck, outcome.lost) == (2, 0)
    outcome.set_apart_stuck({3: copy(3, 1, 0, 140)})
    assert (outcome.stuck, outcome.passed_over, outcome.stuck_numbers) == (1, 1, {2})
    assert outcome.failed  # number 2 is still stuck
    assert "past the group's commit, behind an aborted transaction" in outcome.notes[-1]
    assert "3 at t.g.retry.500ms[0]@140" in outcome.notes[-1]
    outcome.set_apart_stuck({2: copy(2, 1, 1, 9)})
    assert (outcome.stuck, outcome.passed_over, outcome.failed) == (0, 2, False)


def test_a_stuck_note_says_where_each_waits_beside_the_commits_and_first_aborts() -> None:
    waiting = [copy(5, 1, 2, 44), count.Read("t", 0, 9, b"4", []), copy(99, 1, 0, 3)]
    note = count.stuck_note({4, 5}, waiting, {"t": {0: 9}, RETRY: {2: 40}}, {2: [43, 41]})
    assert note == ("stuck: 4 at t[0]@9, 5 at t.g.retry.500ms[2]@44; commits {'t': {0: 9}, "
                    "'t.g.retry.500ms': {2: 40}}; first aborted record by retry partition "
                    "{2: 41}")


def test_copies_the_workload_never_asks_for_are_counted() -> None:
    """A copy of a record that did not fail, or under an attempt its failures do not reach:
    in transactional mode each is a duplicate, not a re-handled record."""
    wanted = {3: {1}, 7: {1, 2}, 1: set()}
    copies = [copy(3, 1, 0, 1), copy(7, 1, 0, 2), copy(7, 2, 0, 3),  # as asked
              copy(3, 2, 0, 4),                                       # 3 fails once only
              copy(1, 1, 0, 5),                                       # 1 never fails
              count.Read(RETRY, 0, 6, b"x", [(h.ATTEMPT, b"1")])]      # no number
    assert count.unwanted_copies(copies, lambda n: wanted.get(n, set())) == 3


def test_lost_numbers_whose_letters_a_restarted_broker_gives_are_set_apart_and_named() -> None:
    outcome = count.Outcome("broker SIGKILL + restart", count.TRANSACTIONAL)
    outcome.tally({1: "ok", 17107: "dead", 17507: "dead"}, count.Counter({1: 1}),
                  count.Counter())
    assert outcome.lost_numbers == {17107, 17507}
    # The recount reads every letter: numbers not lost (1) are not counted again.
    outcome.set_apart_letters({1, 17107})
    assert (outcome.lost, outcome.passed_over, outcome.lost_numbers) == (1, 1, {17507})
    assert outcome.failed
    assert "got them only after the broker restarted on its data ([17107])" in outcome.notes[-1]
    outcome.set_apart_letters({17507})
    assert (outcome.lost, outcome.passed_over, outcome.failed) == (0, 2, False)
