"""Per-key ordering through the store under random failures (a property test on noida-db):
for each key, records succeed in offset order, and every record ends succeeded or dead."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, StoreBackend
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD

from ..consumer.conftest import FAST_GROUP, produce, wait_until
from .conftest import Background, scheduler

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]

# Per record: its key (one of three) and how many times it fails (3 or more: it dies).
RECORDS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=3, max_size=9)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(records=RECORDS)
def test_each_key_succeeds_in_offset_order_under_random_failures(
        records: list[tuple[int, int]], store: RetryStore, bootstrap: str, new_topic: NewTopic,
        unique_name: UniqueName) -> None:
    topic, group = new_topic(partitions=2), unique_name("ordered")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=3)
    failures = {b"v%d" % i: fails for i, (_, fails) in enumerate(records)}
    calls: dict[bytes, int] = defaultdict(int)
    successes: list[tuple[bytes, int]] = []  # (key, original offset) in the order they succeeded
    lock = threading.Lock()

    def handler(record: Record) -> None:
        value = record.value or b""
        with lock:
            calls[value] += 1
            if calls[value] <= failures[value]:
                raise RuntimeError(f"failure {calls[value]} of {value!r}")
            successes.append((record.key or b"", record.origin().offset))

    for i, (key, _) in enumerate(records):
        produce(bootstrap, topic, [b"v%d" % i], key=b"k%d" % key, partition=key % 2)
    consumer = RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP,
                                retry_backend=StoreBackend(store, ordering=True))
    runs = [Background(consumer), Background(scheduler(store, bootstrap))]
    try:
        dying = sum(1 for _, fails in records if fails >= 3)

        def settled() -> bool:
            dead = store.counts(RowFilter(group=group)).get(DEAD, 0)
            with lock:
                return len(successes) + dead == len(records)

        wait_until(settled, 60, f"{len(records)} records succeeded or dead")
    finally:
        for run in runs:
            run.stop()
    assert store.counts(RowFilter(group=group)).get(DEAD, 0) == dying
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for record_key, offset in successes:
        by_key[record_key].append(offset)
    for record_key, offsets in by_key.items():
        assert offsets == sorted(offsets), f"key {record_key!r} succeeded out of order: {offsets}"
    assert len(successes) == len(set(successes))  # none twice
