"""Retries read through their own queue: a retry that falls due while the main topic is a backlog
read flat out is handled before the backlog is through, each retry once, none early."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from .conftest import FAST_GROUP, Running, committed, produce, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]

BACKLOG = 60_000
FAILING = range(0, 3_000, 100)  # 30 records near the head fail once


def test_a_due_retry_does_not_wait_behind_the_main_backlog(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("reader")
    for partition in (0, 1):
        produce(bootstrap, topic, [str(n).encode() for n in range(partition, BACKLOG, 2)],
                partition=partition)
    lock = threading.Lock()
    main_handled = 0
    retries: dict[int, tuple[int, int]] = {}  # number -> (main records handled before, late ms)
    calls: Counter[int] = Counter()
    early: list[int] = []

    def handle(record: Record) -> None:
        nonlocal main_handled
        number = int(record.value or b"-1")
        due = record.delivery.due_ms
        with lock:
            calls[number] += 1
            if due is not None:
                if now_ms() < due:
                    early.append(number)
                retries[number] = (main_handled, now_ms() - due)
                return
            main_handled += 1
        time.sleep(0.00002)  # a handler's work: the backlog takes seconds, not milliseconds
        if number in FAILING:
            raise ConnectionError("transient")

    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("200ms")), handle,
                                config=FAST_GROUP)
    running(consumer)
    wait_until(lambda: committed(bootstrap, group, topic) == {0: BACKLOG // 2, 1: BACKLOG // 2},
               120, "the backlog")
    wait_until(lambda: len(retries) == len(FAILING), 30, "every retry")
    consumer.stop()

    assert not early
    assert all(calls[n] == 2 for n in FAILING)
    assert sum(calls.values()) == BACKLOG + len(FAILING)
    # Each retry came while the backlog was still being read, not after it.
    handled_before = sorted(before for before, _ in retries.values())
    assert handled_before[-1] < BACKLOG * 3 // 4, handled_before


class CountingReader:
    """The retry reader, counting each record it hands out by (partition, offset)."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.handed: Counter[tuple[int, int]] = Counter()
        self.unassigned = 0  # holds and rests

    def consume(self, count: int, wait_s: float) -> list[Any]:
        messages = self._reader.consume(count, wait_s)
        self.handed.update((m.partition(), m.offset()) for m in messages if m.error() is None)
        return messages

    def incremental_unassign(self, partitions: list[Any]) -> None:
        self.unassigned += 1
        self._reader.incremental_unassign(partitions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def test_a_retry_partition_held_at_each_record_fetches_each_record_once(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    # Copies written a few ms apart fall due a few ms apart: the partition is held at nearly
    # every record, and the records fetched behind the held one are kept, not fetched again.
    # The backoff outlasts handling all the originals, even on a loaded machine (with 300 ms,
    # CI's batch of 150 originals outlasted most of them, and only 15 copies were held).
    topic = new_topic(partitions=1)
    group = unique_name("kept")
    count = 150
    produce(bootstrap, topic, [str(n).encode() for n in range(count)], partition=0)
    handled: Counter[int] = Counter()
    early: list[int] = []

    def handle(record: Record) -> None:
        number = int(record.value or b"-1")
        handled[number] += 1
        due = record.delivery.due_ms
        if due is None:
            time.sleep(0.003)
            raise ConnectionError("transient")
        if now_ms() < due:
            early.append(number)

    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("2s")), handle,
                                config=FAST_GROUP)
    consumer.start()
    readers = consumer._consumer
    assert readers is not None and readers.reader is not None
    counting = CountingReader(readers.reader)
    readers.reader = counting  # type: ignore[assignment]
    holds: list[int] = []
    pause = readers.pause

    def counted_pause(partitions: list[Any]) -> None:
        holds.extend(p.offset for p in partitions)
        pause(partitions)

    readers.pause = counted_pause  # type: ignore[method-assign]
    run = running(consumer)
    wait_until(lambda: len(handled) == count and min(handled.values()) == 2, 60, "every retry")
    run.stop()

    assert not early
    assert handled == {n: 2 for n in range(count)}
    assert sum(counting.handed.values()) == count  # each copy handed out once...
    assert set(counting.handed.values()) == {1}  # ...and none twice
    assert len(holds) >= count // 3, len(holds)  # though held again and again,
    assert counting.unassigned <= len(holds) // 5, counting.unassigned  # mostly without a call
