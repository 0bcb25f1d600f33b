"""Retries read through their own queue: a retry that falls due while the main topic is a backlog
read flat out is handled before the backlog is through, each retry once, none early."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

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
