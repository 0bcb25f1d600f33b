"""Leases of rows in flight, on SQLite and PostgreSQL: a republished retry whose copy is never
reported handled is republished once its lease runs out, and not before."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.errors import InvalidArgument
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, StoreBackend
from redrive.store.rows import RowFilter, Success
from redrive.store.schema import IN_FLIGHT, PENDING, SUCCEEDED

from ..consumer.conftest import FAST_GROUP, produce, read_all, topic_size, wait_until
from .conftest import Background, Calls, Runnable, entry, scheduler

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[Runnable], Background]


def test_rows_in_flight_past_their_lease_are_republished_and_no_others(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("lease")
    due = now_ms() - 1
    store.write([entry(group, topic, o, value=b"%d" % o, due_ms=due) for o in range(3)], [])
    sched = scheduler(store, bootstrap, lease_s=1.0)
    try:
        assert sched.run_once().published == 3
        dispatched = {r.offset: r.dispatched_ms for r in store.find()}
        assert sched.reclaim() == 0  # the lease has not run out
        assert store.counts() == {IN_FLIGHT: 3}
        # The copy of offset 1 was handled; those of 0 and 2 were lost on the way.
        store.write([], [Success(group, topic, 0, 1, 1, None)])
        time.sleep(1.05)
        assert sched.reclaim() == 2
        assert store.counts() == {PENDING: 2, SUCCEEDED: 1}
        assert sched.metrics.total("redrive_reclaimed_total") == 2
        assert sched.run_once().published == 2
    finally:
        sched.close()
    rows = {r.offset: r for r in store.find()}
    assert {o: (r.status, r.dispatches, r.due_ms) for o, r in rows.items()} == {
        0: (IN_FLIGHT, 2, due), 1: (SUCCEEDED, 1, due), 2: (IN_FLIGHT, 2, due)}
    for offset in (0, 2):
        dispatched_again = rows[offset].dispatched_ms
        first = dispatched[offset]
        assert first is not None and dispatched_again is not None
        assert dispatched_again >= first + 1000
    copies = read_all(bootstrap, topic, expect=5, timeout_s=30)
    assert sorted(int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies) == [0, 0, 1, 2, 2]


def test_a_copy_skipped_by_an_offset_reset_is_handled_after_the_lease(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        background: Start) -> None:
    topic, group = new_topic(), unique_name("reset")
    calls = Calls()

    def handler(record: Record) -> None:
        calls.add(record)
        if calls.count(b"lost") == 1:
            raise RuntimeError("fails once")

    def consumer() -> RetryingConsumer:
        return RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("200ms")), handler,
                                config=FAST_GROUP, retry_backend=StoreBackend(store))

    produce(bootstrap, topic, [b"lost"])
    first = background(consumer())
    wait_until(lambda: store.counts() == {PENDING: 1}, 30, "the failure stored")
    first.stop()
    sched = scheduler(store, bootstrap, lease_s=1.0)
    try:
        wait_until(lambda: sched.run_once().published == 1, 10, "the retry republished")
    finally:
        sched.close()
    dispatched = store.find()[0].dispatched_ms
    assert dispatched is not None
    # An operator resets the group's offsets to the end: the copy will never be read.
    size = topic_size(bootstrap, topic)
    assert size == 2
    resetter = kafka.consumer(bootstrap, group)
    try:
        resetter.commit(offsets=[TopicPartition(topic, 0, size)], asynchronous=False)
    finally:
        resetter.close()

    background(consumer())
    running = background(scheduler(store, bootstrap, lease_s=1.0))
    wait_until(lambda: store.counts() == {SUCCEEDED: 1}, 30, "the retry handled")
    running.stop()
    assert calls.count(b"lost") == 2  # the failure, then the copy republished after the lease
    retried, at_ms = calls.records()[1]
    assert retried.delivery.attempt == 1
    assert at_ms >= dispatched + 1000
    row = store.find(RowFilter(statuses=(SUCCEEDED,)))[0]
    assert row.dispatches == 2
    assert topic_size(bootstrap, topic) == 3  # the original and two copies


@pytest.mark.parametrize("lease_s", [0, -1.0, "10m", True])
def test_a_lease_that_is_not_a_positive_number_of_seconds_is_refused(
        store: RetryStore, bootstrap: str, lease_s: object) -> None:
    with pytest.raises(InvalidArgument, match="lease_s"):
        scheduler(store, bootstrap, lease_s=lease_s)


def test_a_claim_taken_over_after_it_ran_out_is_left_alone_by_its_first_claimer(
        store: RetryStore) -> None:
    """A scheduler that stalls past its claim (a long pause, a stopped VM) and then settles
    must not touch rows another scheduler claimed since: it handed them back, held or killed
    them under the other's feet, and a row the other had published was published again."""
    t = now_ms()
    store.write([entry("g", "t", o, due_ms=t - 10) for o in range(4)], [])
    with store.take_due(10, at_ms=t) as stale:
        stale.defer()
    assert store.reclaim_expired(60_000, claim_ms=1_000, at_ms=t + 1_000) == 4
    with store.take_due(10, at_ms=t + 1_001) as fresh:
        fresh.defer()
    assert len(fresh.rows) == 4
    first, second, third, _unmarked = stale.rows
    stale.mark_dead([first], "expired", "the record is no longer in Kafka", t + 1_002)
    stale.mark_held(second.id, t + 60_000)
    stale.mark_in_flight([third.id], t + 1_002)
    # The fourth is left unmarked: a settle would hand it back.
    store.settle(stale)
    assert {r.offset: (r.status, r.dispatched_ms) for r in store.find()} == {
        o: (IN_FLIGHT, None) for o in range(4)}

    fresh.mark_in_flight([r.id for r in fresh.rows], t + 1_003)
    store.settle(fresh)
    assert {r.offset: (r.status, r.dispatched_ms, r.dispatches) for r in store.find()} == {
        o: (IN_FLIGHT, t + 1_003, 1) for o in range(4)}
