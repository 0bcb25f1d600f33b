"""Copies deleted before they are handled are never lost in silence: a retry topic or delay tier
that keeps records no longer than they wait there, or compacts them, is refused at start, and
copies a stopped group had not read when they were deleted are reported when it takes the
partitions again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from redrive import kafka
from redrive.backends import DelayQueue
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.retention import CompactedTopic, RetentionTooShort
from redrive.store import RetryStore, StoreBackend
from redrive.store.schema import REFERENCE
from redrive.topics import plan

from .conftest import FAST_GROUP, Handled, Running, committed, produce, topic_size, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]

POLICY = RetryPolicy(backoff=Backoff.fixed("5s"), attempts=2)


class Transient(Exception):
    pass


def fail_first(record: Record) -> None:
    if record.delivery.attempt == 0:
        raise Transient(f"{record.key!r} fails its first delivery")


def test_a_retry_topic_that_deletes_copies_before_they_are_due_is_refused_at_start(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("short")
    retry = plan(POLICY, topic, group).retry_topic_names[0]
    new_topic(name=retry, config={"retention.ms": "5000"})  # as long as the delay: too short
    consumer = RetryingConsumer(bootstrap, topic, group, POLICY, fail_first, config=FAST_GROUP)
    with pytest.raises(RetentionTooShort) as raised:
        consumer.start()
    assert raised.value.topic == retry
    assert (raised.value.retention_ms, raised.value.wait_ms) == (5000, 5000)
    assert f"topic {retry!r} has retention.ms=5000 (5s)" in str(raised.value)
    consumer.close()

    # One millisecond longer than the wait is accepted (the default of 7 days, far more so).
    longer = unique_name("longer")
    new_topic(name=plan(POLICY, topic, longer).retry_topic_names[0],
              config={"retention.ms": "5001"})
    accepted = RetryingConsumer(bootstrap, topic, longer, POLICY, fail_first, config=FAST_GROUP)
    accepted.start()
    accepted.close()

    # A compacting retry topic would drop a waiting copy once a later one of its key came.
    compacting = unique_name("compacting")
    compacted = new_topic(name=plan(POLICY, topic, compacting).retry_topic_names[0],
                          config={"cleanup.policy": "compact"})
    refused = RetryingConsumer(bootstrap, topic, compacting, POLICY, fail_first,
                               config=FAST_GROUP)
    with pytest.raises(CompactedTopic, match=f"{compacted!r} has cleanup.policy=compact"):
        refused.start()
    refused.close()


def test_a_delay_tier_that_deletes_records_before_their_delay_is_refused(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    prefix = unique_name("tiers")
    tiers = Tiers.parse("1s,1m", prefix=prefix)
    new_topic(name=tiers.topics[0], partitions=2)
    new_topic(name=tiers.topics[1], partitions=2, config={"retention.ms": "30000"})
    service = DelayService(bootstrap, tiers, group_id=unique_name("delay"), partitions=2,
                           transactional=False)
    with pytest.raises(RetentionTooShort, match=f"'{tiers.topics[1]}' has retention.ms=30000"):
        service.run()
    # A runtime sending its failures through those tiers is refused as well.
    topic = new_topic()
    consumer = RetryingConsumer(bootstrap, topic, unique_name("dq"), POLICY, fail_first,
                                config=FAST_GROUP, retry_backend=DelayQueue(tiers))
    with pytest.raises(RetentionTooShort, match="no longer than the 1m a record waits"):
        consumer.start()
    consumer.close()


def test_copies_deleted_while_the_group_was_stopped_are_reported_when_it_comes_back(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        caplog: pytest.LogCaptureFixture) -> None:
    topic, group = new_topic(partitions=2), unique_name("gone")
    retry = plan(POLICY, topic, group).retry_topic_names[0]
    for i in range(6):
        produce(bootstrap, topic, [f"old{i}".encode()], key=f"old{i}".encode(), partition=i % 2)
    first = running(RetryingConsumer(bootstrap, topic, group, POLICY, fail_first,
                                     config=FAST_GROUP))
    wait_until(lambda: topic_size(bootstrap, retry) == 6
               and sum(committed(bootstrap, group, topic).values()) == 6, 20,
               "6 copies written and their originals committed")
    first.stop()  # within the copies' 5 s: none was due yet
    assert first.total("redrive_processed_total") == 0

    # What retention does to a group stopped for too long, done at once: the copies go.
    admin = kafka.admin(bootstrap)
    ends = {p: kafka.watermarks(kafka.consumer(bootstrap), retry, p)[1] for p in (0, 1)}
    assert sum(ends.values()) == 6
    for future in admin.delete_records([TopicPartition(retry, p, end)
                                        for p, end in ends.items()]).values():
        future.result(10)

    seen = Handled()

    def note_and_fail_first(record: Record) -> None:
        seen.add(record)
        fail_first(record)

    with caplog.at_level(logging.ERROR, logger="redrive.retention"):
        second = running(RetryingConsumer(bootstrap, topic, group, POLICY, note_and_fail_first,
                                          config=FAST_GROUP))
        wait_until(lambda: second.total("redrive_lost_offsets_total") == 6, 20, "the loss told")
        # The group commits past the gap: a partition that gets nothing more is never
        # committed otherwise, and each later assignment, anywhere, told the same loss again.
        second.stop()
        assert committed(bootstrap, group, retry) == ends
        third = running(RetryingConsumer(bootstrap, topic, group, POLICY, note_and_fail_first,
                                         config=FAST_GROUP))
        for i in range(4):
            produce(bootstrap, topic, [f"new{i}".encode()], key=f"new{i}".encode(),
                    partition=i % 2)
        wait_until(lambda: third.total("redrive_processed_total") == 4, 30,
                   "the 4 new records handled on their retry")
    assert third.total("redrive_lost_offsets_total") == 0
    # The group never committed on the retry partitions: all they held was its own.
    lost = [message for message in caplog.messages if "no longer holds" in message]
    assert sorted(lost) == sorted(
        f"group {group}: {retry}[{p}] no longer holds offsets 0 to {ends[p] - 1}, which the "
        "group had not committed: deleted (retention.ms, or DeleteRecords) while it was "
        "stopped or behind. Their originals were committed when they were written: up to "
        f"{ends[p]} record(s) lost (unless the group's committed offsets expired after it "
        f"handled them: offsets.retention.minutes). Reading on from offset {ends[p]}"
        for p in (0, 1) if ends[p]), caplog.messages
    assert second.consumer.metrics.value("redrive_lost_offsets_total", topic=retry) == 6
    deliveries = [(record.key, record.delivery.attempt) for record, _ in seen.calls]
    assert sorted(deliveries) == sorted((f"new{i}".encode(), attempt)
                                        for i in range(4) for attempt in (0, 1))


def test_a_store_keeping_references_refuses_a_main_topic_that_deletes_them_before_the_last_retry(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, tmp_path: Path) -> None:
    """In reference mode the store keeps only where a record is and reads it back from the main
    topic at each retry: the original must outlast every delay of the policy."""
    policy = RetryPolicy(backoff=Backoff.sequence("2s,3s"))  # the last retry 5 s on
    topic = new_topic(config={"retention.ms": "5000"})
    store = RetryStore(str(tmp_path / "store.db"))
    try:
        by_reference = RetryingConsumer(
            bootstrap, topic, unique_name("ref"), policy, fail_first, config=FAST_GROUP,
            retry_backend=StoreBackend(store, mode=REFERENCE))
        with pytest.raises(RetentionTooShort,
                           match=f"{topic!r} has retention.ms=5000 .* the 5s a record waits"):
            by_reference.start()
        by_reference.close()
        # With the payload in the store, the main topic's retention does not matter.
        by_payload = RetryingConsumer(bootstrap, topic, unique_name("payload"), policy,
                                      fail_first, config=FAST_GROUP,
                                      retry_backend=StoreBackend(store))
        by_payload.start()
        by_payload.close()
    finally:
        store.close()
