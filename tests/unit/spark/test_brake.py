"""The Spark brake's judgement of a batch: the same trips and counts as judging its records one by
one in offset order, as RetryingConsumer's brake does; and the control topic's Stop records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.control import Resume, Stop, decode
from redrive.errors import InvalidArgument
from redrive.policy import DeadLetterLimit
from redrive.policy.brake import Window
from redrive.spark.brake import judge

TP = ("orders", 0)
SUCCESS, RETRY, DEAD = "s", "r", "d"


def one_by_one(window: Window, limit: DeadLetterLimit,
               outcomes: list[tuple[int, str]]) -> int | None:
    """The consumer's way: each record in offset order; the offset of the dead letter that would
    pass the limit, or None."""
    for offset, outcome in sorted(outcomes):
        if outcome == SUCCESS:
            window.add(1, False)
        elif outcome == DEAD:
            if window.passes(limit):
                return offset
            window.add(1, True)
    return None


def state(window: Window) -> tuple[int, int, int, list[list[int]]]:
    return window.total, window.dead, window.in_a_row, [run[:] for run in window._runs]


limits = st.builds(DeadLetterLimit,
                   ratio=st.one_of(st.none(), st.floats(0, 0.95)),
                   window=st.integers(1, 12),
                   consecutive=st.integers(0, 6)) | st.builds(
    DeadLetterLimit, ratio=st.floats(0, 0.95), window=st.integers(1, 12))
batches = st.lists(st.lists(st.sampled_from([SUCCESS, SUCCESS, RETRY, DEAD]), max_size=30),
                   min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(limit=limits, runs=batches, gaps=st.lists(st.integers(1, 3), min_size=120, max_size=120))
def test_batches_judge_as_records_one_by_one(limit: DeadLetterLimit, runs: list[list[str]],
                                             gaps: list[int]) -> None:
    """Batch after batch, with gaps in the offsets (transaction markers, other groups' copies
    left out), the batch trips at the record the one-by-one judgement trips at, and carries the
    same window on."""
    reference = Window(limit.window)
    windows: dict[tuple[str, int], Window] = {}
    offset = 0
    for kinds in runs:
        outcomes = []
        for kind in kinds:
            outcomes.append((offset, kind))
            offset += gaps[offset % len(gaps)]
        expected = one_by_one(reference, limit, outcomes)
        failed = {o: kind == DEAD for o, kind in outcomes if kind != SUCCESS}
        offsets = np.array([o for o, _ in outcomes], dtype=np.int64)
        trips, after = judge(windows, limit, {TP: offsets} if outcomes else {},
                             {TP: failed} if failed else {})
        if expected is not None:
            assert trips == {TP: expected}
            assert TP not in after
            return
        assert trips == {}
        if outcomes:
            assert state(after[TP]) == state(reference)
            windows = {**windows, **after}


@settings(max_examples=200, deadline=None)
@given(limit=limits, before=st.lists(st.booleans(), max_size=20), successes=st.integers(0, 50),
       retries=st.integers(0, 5))
def test_a_batch_without_dead_letters_needs_only_counts(limit: DeadLetterLimit,
                                                        before: list[bool], successes: int,
                                                        retries: int) -> None:
    window = Window(limit.window)
    for dead in before:
        window.add(1, dead)
    windows = {TP: window}
    failed = {1000 + i: False for i in range(retries)}
    trips, counted = judge(windows, limit, {TP: successes + retries}, {TP: failed})
    offsets = np.arange(1000, 1000 + successes + retries, dtype=np.int64)
    trips_ordered, ordered = judge(windows, limit, {TP: offsets}, {TP: failed})
    assert trips == trips_ordered == {}
    assert state(counted[TP]) == state(ordered[TP])
    assert state(windows[TP]) == state(window)  # the windows given are not changed


def test_each_partition_trips_at_its_own_record() -> None:
    limit = DeadLetterLimit(consecutive=2)
    other = ("orders", 1)
    trips, after = judge(
        {}, limit,
        {TP: np.arange(10, dtype=np.int64), other: np.arange(5, dtype=np.int64)},
        {TP: {3: True, 4: True, 5: True, 6: True}, other: {0: True, 1: True, 2: False}})
    assert trips == {TP: 5}
    assert set(after) == {other}
    # 0 and 1 dead-lettered, 2 retried (not counted), 3 and 4 succeeded
    assert (after[other].dead, after[other].in_a_row, after[other].total) == (2, 0, 4)


def test_dead_letters_without_their_order_are_refused() -> None:
    with pytest.raises(ValueError, match="offsets"):
        judge({}, DeadLetterLimit(consecutive=1), {TP: 3}, {TP: {1: True}})


def test_a_stop_reads_back_as_written_and_requests_tell_their_kind() -> None:
    stop = Stop("billing", "orders.billing.retry.5s", 2, 41, "orders", 1_700_000_000_000,
                60_000, "more than 5 in a row")
    assert decode(stop.encode()) == stop
    assert stop.tp == ("orders.billing.retry.5s", 2)
    resume = Resume("billing", "orders", 2, "oncall@host", 5)
    assert decode(resume.encode()) == resume
    assert Resume.decode(resume.encode()) == resume
    with pytest.raises(InvalidArgument, match=r"control request=.*expected action 'resume'$"):
        Resume.decode(stop.encode())
    with pytest.raises(InvalidArgument, match=r"expected action 'resume' or 'stop'"):
        decode(b'{"action": "pause", "group": "billing"}')
    with pytest.raises(InvalidArgument, match=r"unexpected keyword argument 'extra'"):
        decode(b'{"action": "stop", "group": "g", "topic": "t", "partition": 0, "offset": 1, '
               b'"main": "t", "at_ms": 1, "extra": 2}')
    with pytest.raises(InvalidArgument, match=r"stop.partition='0': must be an integer >= 0"):
        decode(b'{"action": "stop", "group": "g", "topic": "t", "partition": "0", "offset": 1, '
               b'"main": "t", "at_ms": 1}')
    with pytest.raises(InvalidArgument, match=r"stop.main='': must be a name"):
        Stop("g", "t", 0, 1, "", 1)
