"""A policy change strands no retry: copies waiting in the retry topics of an earlier policy
(another backoff, so other topic names) are read by the new one, each when due, and routed by the
new plan when they fail again."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest

from redrive import former_looks, kafka
from redrive import headers as h
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.routing import Retry, route
from redrive.topics import ensure_topics, plan

from ..records import produce_input
from .conftest import (
    FAST_GROUP,
    Handled,
    Running,
    committed,
    produce,
    read_all,
    topic_size,
    wait_until,
)

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Transient(Exception):
    pass


def test_retries_waiting_in_an_earlier_policys_topics_are_handled_by_the_new_one(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        caplog: pytest.LogCaptureFixture) -> None:
    topic, group = new_topic(partitions=2), unique_name("former")
    before = RetryPolicy(backoff=Backoff.fixed("5s"), attempts=4)
    after = RetryPolicy(backoff=Backoff.fixed("300ms"), attempts=4)
    old_retry = plan(before, topic, group).retry_topic_names[0]
    new_retry = plan(after, topic, group).retry_topic_names[0]
    assert (old_retry, new_retry) == (f"{topic}.{group}.retry.5s", f"{topic}.{group}.retry.300ms")
    keys = [f"k{i}".encode() for i in range(20)]
    failing = set(keys[:10])

    def fail_first(record: Record) -> None:
        if record.key in failing and record.delivery.attempt == 0:
            raise Transient(f"{record.key!r} fails its first delivery")

    for i, key in enumerate(keys):
        produce(bootstrap, topic, [key], key=key, partition=i % 2)
    first = running(RetryingConsumer(bootstrap, topic, group, before, fail_first,
                                     config=FAST_GROUP))
    wait_until(lambda: topic_size(bootstrap, old_retry) == 10
               and sum(committed(bootstrap, group, topic).values()) == 20, 20,
               "10 copies in the 5s retry topic and the main topic committed")
    first.stop()  # within the copies' 5 s: none of them was due yet
    assert first.total("redrive_processed_total") == 10
    assert sum(max(0, offset) for offset in committed(bootstrap, group, old_retry).values()) == 0

    # The new policy names other retry topics; one copy fails again there.
    seen = Handled()

    def fail_k0_again(record: Record) -> None:
        seen.add(record)
        if record.key == b"k0" and record.delivery.attempt == 1:
            raise Transient("k0 fails its second delivery too")

    with caplog.at_level(logging.WARNING, logger="redrive.topics"):
        second = running(RetryingConsumer(bootstrap, topic, group, after, fail_k0_again,
                                          config=FAST_GROUP))
    assert old_retry in second.consumer.subscribed
    assert any(old_retry in message and "up to 10 records" in message
               for message in caplog.messages), caplog.messages
    wait_until(lambda: second.total("redrive_processed_total") == 10, 30,
               "the 10 waiting copies handled")
    second.stop()

    handled = [(record, at_ms) for record, at_ms in seen.calls if record.key in failing]
    assert sorted(record.key for record, _ in handled) == sorted([*failing, b"k0"])
    for record, at_ms in handled:
        assert record.delivery.due_ms is not None and at_ms >= record.delivery.due_ms
        assert record.delivery.original is not None
        assert record.delivery.original.topic == topic
    assert sorted((r.key, r.topic, r.delivery.attempt) for r, _ in handled if r.key == b"k0") \
        == [(b"k0", new_retry, 2), (b"k0", old_retry, 1)]
    # Counted under the main topic, as every retry is.
    assert second.consumer.metrics.value("redrive_retried_total", topic=topic, attempt="2") == 1
    copies = read_all(bootstrap, new_retry, expect=1)
    assert [(c.key, c.header(h.ATTEMPT)) for c in copies] == [(b"k0", "2")]
    assert sum(committed(bootstrap, group, old_retry).values()) == 10

    # Once empty, the earlier policy's topic is no longer read.
    third = RetryingConsumer(bootstrap, topic, group, after, fail_k0_again, config=FAST_GROUP)
    try:
        third.start()
        assert old_retry not in third.subscribed
    finally:
        third.close()


def test_copies_written_to_an_earlier_policys_topic_after_the_start_are_handled(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A rolling deploy: an instance with the new policy starts while the group's earlier retry
    topic is empty, and an instance not yet redeployed then copies failures there. Looked for
    only at start, those copies waited for the next restart; the consumer now looks again as it
    runs (every LOOK_EVERY_S, 60 s; 0.5 s here)."""
    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 0.5)
    topic, group = new_topic(partitions=2), unique_name("redeploy")
    before = RetryPolicy(backoff=Backoff.fixed("2s"), attempts=4)
    after = RetryPolicy(backoff=Backoff.fixed("300ms"), attempts=4)
    old_plan = plan(before, topic, group)
    old_retry = old_plan.retry_topic_names[0]
    ensure_topics(kafka.admin(bootstrap), old_plan)  # there, and empty at the start
    produce(bootstrap, topic, [b"first"], key=b"first")
    seen = Handled()
    with caplog.at_level(logging.WARNING, logger="redrive.topics"):
        new = running(RetryingConsumer(bootstrap, topic, group, after, seen.add,
                                       config=FAST_GROUP))
        assert old_retry not in new.consumer.subscribed
        wait_until(lambda: seen.count(b"first") == 1, 30, "the first record handled")
        # Copies as the instance with the earlier policy writes them.
        keys = [f"k{i}".encode() for i in range(5)]
        copies = []
        for i, key in enumerate(keys):
            failed = Record(topic, i % 2, 100 + i, now_ms(), key, key, [])
            decision = route(failed, Transient("fails its first delivery"), before, now_ms(),
                             group=group)
            assert isinstance(decision, Retry) and decision.topic == old_retry
            copies.append(kafka.OutRecord(decision.topic, failed.value, failed.key,
                                          decision.headers, decision.partition))
        produce_input(bootstrap, copies)
        wait_until(lambda: all(seen.count(key) == 1 for key in keys), 30,
                   "the 5 later copies handled")
    assert old_retry in new.consumer.subscribed
    # Found by a look while the copies were written, or after: it counts those there by then.
    assert any(old_retry in message and re.search(r"holds up to [1-5] records", message)
               for message in caplog.messages), caplog.messages
    for record, at_ms in seen.calls:
        if record.key in keys:
            assert (record.topic, record.delivery.attempt) == (old_retry, 1)
            assert record.delivery.due_ms is not None and at_ms >= record.delivery.due_ms
    wait_until(lambda: sum(committed(bootstrap, group, old_retry).values()) == 5, 30,
               "the 5 copies committed")
    new.stop()
    assert seen.count(b"first") == 1 and len(seen.calls) == 6
