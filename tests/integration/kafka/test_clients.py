"""redrive.kafka's clients, produce and admin, against the session broker (and a closed port)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from redrive import kafka
from redrive.dev.ports import free_port
from redrive.errors import BrokerUnavailable, DeliveryFailed, UnknownTopic
from redrive.kafka.admin import waiting_past

pytestmark = pytest.mark.integration

# For clients of a closed port: the error's traceback keeps them alive until garbage collection,
# and their "connection refused" lines would reach the terminal after pytest stops capturing.
QUIET = logging.getLogger("test.closed-port")

HEADERS: list[tuple[str, bytes]] = [
    ("trace-id", b"4bf92f3577b34da6"),
    ("blob", b"\xff\x00\xfe\x80 not utf-8"),
    ("trace-id", b"repeated names keep their order"),
    ("empty", b""),
]


def read_records(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[Message]:
    """Every partition of `topic` from the beginning, until `count` records arrived."""
    consumer = kafka.consumer(bootstrap)
    partitions = kafka.partition_count(kafka.admin(bootstrap), topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append(message)
    finally:
        consumer.close()
    assert len(received) == count, f"read {len(received)} of {count} records from {topic}"
    return received


# (partition, offset) -> (key, value, headers)
Contents = dict[tuple[object, object], tuple[object, ...]]


def as_tuples(messages: Sequence[Message]) -> Contents:
    return {(m.partition(), m.offset()): (m.key(), m.value(), m.headers()) for m in messages}


def expected_tuples(delivered: Sequence[kafka.Delivered],
                    records: Sequence[kafka.OutRecord]) -> Contents:
    return {(d.partition, d.offset): (r.key, r.value, list(r.headers))
            for d, r in zip(delivered, records, strict=True)}


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"


# --- produce, consume, admin ------------------------------------------------------------------


def test_produce_confirmed_offsets_are_where_a_consumer_finds_the_records_intact(
        bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    records = [kafka.OutRecord(topic, value=f"value-{i}".encode(), key=f"key-{i}".encode(),
                               headers=[*HEADERS, ("seq", str(i).encode())], partition=i % 3)
               for i in range(7)]
    records.append(kafka.OutRecord(topic, value=None, key=b"tombstone", headers=HEADERS,
                                   partition=1))

    delivered = kafka.produce_confirmed(kafka.producer(bootstrap), records)

    assert [(d.topic, d.partition, d.offset) for d in delivered] == [
        (topic, 0, 0), (topic, 1, 0), (topic, 2, 0), (topic, 0, 1), (topic, 1, 1),
        (topic, 2, 1), (topic, 0, 2), (topic, 1, 2)]
    assert as_tuples(read_records(bootstrap, topic, len(records))) == expected_tuples(delivered,
                                                                                     records)


def test_produce_acked_counts_every_record_the_broker_holds(
        bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    records = [kafka.OutRecord(topic, value=f"value-{i}".encode(), headers=HEADERS,
                               partition=i % 2) for i in range(500)]

    assert kafka.produce_acked(kafka.producer(bootstrap), records) == 500

    found = read_records(bootstrap, topic, 500)
    assert sorted(m.value() for m in found) == sorted(r.value for r in records)
    assert {m.partition() for m in found} == {0, 1}


def test_create_topics_creates_requested_partition_counts_and_is_idempotent(
        bootstrap: str, unique_name: Callable[..., str]) -> None:
    admin = kafka.admin(bootstrap)
    wanted = {unique_name(): 1, unique_name(): 4}

    assert sorted(kafka.create_topics(admin, wanted)) == sorted(wanted)
    counts = kafka.topic_partitions(admin)
    assert {name: counts.get(name) for name in wanted} == wanted

    extra = unique_name()
    assert kafka.create_topics(admin, {**wanted, extra: 2}) == [extra]
    assert kafka.create_topics(admin, wanted) == []
    counts = kafka.topic_partitions(admin)
    assert {name: counts.get(name) for name in [*wanted, extra]} == {**wanted, extra: 2}


def test_delete_topics_waits_until_they_are_gone(bootstrap: str,
                                                 unique_name: Callable[..., str]) -> None:
    admin = kafka.admin(bootstrap)
    doomed, kept = [unique_name(), unique_name()], unique_name()
    kafka.create_topics(admin, {**dict.fromkeys(doomed, 2), kept: 1})

    kafka.delete_topics(admin, doomed)
    counts = kafka.topic_partitions(admin)
    assert [name in counts for name in [*doomed, kept]] == [False, False, True]
    kafka.delete_topics(admin, [])  # nothing to do is no request


def test_waiting_past_counts_no_partition_below_zero(bootstrap: str,
                                                    unique_name: Callable[..., str]) -> None:
    # A commit past a partition's end (the topic was recreated) must not cancel the records
    # that wait in another partition: a former retry topic that holds copies would be dropped.
    admin = kafka.admin(bootstrap)
    topic, group = unique_name(), unique_name("group")
    kafka.create_topics(admin, {topic: 2})
    kafka.produce_confirmed(kafka.producer(bootstrap),
                            [kafka.OutRecord(topic, b"copy", partition=1) for _ in range(5)])
    committer = kafka.consumer(bootstrap, group)
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
    finally:
        committer.close()
    assert waiting_past(bootstrap, group, [topic], {topic: 2}) == {topic: 5}


def test_partition_count_of_a_missing_topic_names_it(bootstrap: str,
                                                     unique_name: Callable[..., str]) -> None:
    missing = unique_name("never-created")
    with pytest.raises(UnknownTopic, match=missing):
        kafka.partition_count(kafka.admin(bootstrap), missing)


def test_check_reachable_on_a_closed_port_names_the_address_quickly() -> None:
    address = closed_address()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as caught:
        kafka.check_reachable({"bootstrap.servers": address, "logger": QUIET})
    assert time.monotonic() - started < 10
    assert caught.value.bootstrap == address
    assert repr(address) in str(caught.value)


def test_produce_confirmed_to_a_down_broker_raises_delivery_failed_naming_the_topic() -> None:
    producer = kafka.producer(closed_address(),
                              overrides={"message.timeout.ms": 2000, "logger": QUIET})
    started = time.monotonic()
    with pytest.raises(DeliveryFailed) as caught:
        kafka.produce_confirmed(producer, [kafka.OutRecord("orders-nowhere", b"v")],
                                timeout_s=20)
    assert time.monotonic() - started < 15
    assert caught.value.topic == "orders-nowhere"
    assert "orders-nowhere" in str(caught.value)


def test_produce_acked_to_a_down_broker_raises_delivery_failed_naming_the_topic() -> None:
    producer = kafka.producer(closed_address(),
                              overrides={"message.timeout.ms": 2000, "logger": QUIET})
    with pytest.raises(DeliveryFailed) as caught:
        kafka.produce_acked(producer, [kafka.OutRecord("orders-nowhere", b"v")] * 3,
                            timeout_s=20)
    assert caught.value.topic == "orders-nowhere"
    assert caught.value.unanswered
