"""Property: whatever the failure pattern, no record is handled before its redrive-due, and every
record ends succeeded or dead-lettered, with exactly the attempts the policy allows."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from .conftest import FAST_GROUP, Handled, Running, produce, wait_until


class Flaky(Exception):
    pass


@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(delays=st.lists(st.sampled_from([200, 350, 500, 800]), min_size=1, max_size=2),
       failures=st.lists(st.integers(0, 3), min_size=2, max_size=8),
       partitions=st.integers(1, 2))
def test_no_record_is_handled_before_it_is_due(bootstrap: str, delays: list[int],
                                               failures: list[int], partitions: int) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"due-prop-{suffix}", f"due-prop-{suffix}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: partitions})
    for index in range(len(failures)):
        produce(bootstrap, topic, [str(index).encode()], partition=index % partitions)
    policy = RetryPolicy(backoff=Backoff.sequence([f"{d}ms" for d in delays]))
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        index = int(record.value or b"0")
        if seen.count(record.value or b"") <= failures[index]:
            raise Flaky(f"{index} fails")

    run = Running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    try:
        wait_until(lambda: run.total("redrive_processed_total")
                   + run.total("redrive_dead_lettered_total") == len(failures), 30,
                   "every record to end")
    finally:
        run.stop()

    early = [(record.value, at_ms, record.delivery.due_ms) for record, at_ms in seen.calls
             if record.delivery.due_ms is not None and at_ms < record.delivery.due_ms]
    assert early == []
    attempts = policy.max_attempts
    calls = Counter(seen.values())
    assert calls == {str(i).encode(): min(f + 1, attempts) for i, f in enumerate(failures)}
    assert run.total("redrive_dead_lettered_total") == sum(f >= attempts for f in failures)
    assert run.total("redrive_retried_total") == sum(min(f, attempts - 1) for f in failures)
