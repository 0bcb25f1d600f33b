"""redrive.kafka.holds with a real confluent-kafka consumer on the session broker: a held partition
delivers nothing until its hold is released while the others go on, the release redelivers the
held record at its offset, a revoke drops the hold, and the poll wait and age gauges follow the
holds."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from redrive import kafka
from redrive.clock import now_ms
from redrive.kafka.holds import Hold, Holds, Why

from .conftest import DEADLINE_S, produce_values, values_of

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]

HOLD_MS = 1_500
# How long a held partition is watched for records it must not deliver: records already fetched
# would come within milliseconds.
QUIET_MS = 1_000
# Members notice a rebalance at their next heartbeat: soon, for a test.
FAST_HEARTBEAT = {"heartbeat.interval.ms": 200}


def assigned_consumer(bootstrap: str, group: str, topic: str, partitions: int) -> Consumer:
    consumer = kafka.consumer(bootstrap, group)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def poll_until(consumer: Consumer, done: Callable[[list[Message]], bool],
               timeout_s: float = DEADLINE_S) -> list[Message]:
    """Records polled one at a time until `done(records so far)`."""
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not done(received):
        assert time.monotonic() < deadline, f"gave up after {timeout_s}s with {where(received)}"
        message = consumer.poll(0.1)
        if message is None:
            continue
        assert message.error() is None, message.error()
        received.append(message)
    return received


def where(messages: Sequence[Message]) -> list[tuple[int, int]]:
    return [(int(m.partition() or 0), int(m.offset() or 0)) for m in messages]


def offsets_in(messages: Sequence[Message], partition: int) -> list[int]:
    return [offset for p, offset in where(messages) if p == partition]


def test_a_held_partition_delivers_nothing_until_due_then_again_from_the_held_offset(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic = new_topic(2)
    produce_values(bootstrap, topic, [f"p0-{i}" for i in range(4)], partition=0)
    produce_values(bootstrap, topic, [f"p1-{i}" for i in range(3)], partition=1)
    consumer = assigned_consumer(bootstrap, unique_name(), topic, 2)
    holds = Holds()
    try:
        # Read p0 up to offset 1, the record that is not due yet; 2 and 3 are fetched behind it.
        before = poll_until(consumer, lambda got: 1 in offsets_in(got, 0))
        head = before[-1]
        assert offsets_in(before, 0) == [0, 1]
        due = now_ms() + HOLD_MS
        holds.hold(consumer, (topic, 0), Hold(1, due, Why.DUE, head.timestamp()[1]))
        assert (topic, 0) in holds and len(holds) == 1
        # While p0 is held, p1 goes on, records written meanwhile included.
        produce_values(bootstrap, topic, ["p0-4"], partition=0)
        produce_values(bootstrap, topic, ["p1-3"], partition=1)
        seen_p1 = offsets_in(before, 1)
        held = poll_until(consumer, lambda got: sorted(seen_p1 + offsets_in(got, 1)) == [0, 1, 2, 3]
                          and now_ms() >= due)
        assert offsets_in(held, 0) == []
        assert holds.release_due(consumer, due - 1) == []
        assert (topic, 0) in holds

        assert holds.release_due(consumer, now_ms()) == [(topic, 0)]

        assert (topic, 0) not in holds and len(holds) == 0
        after = poll_until(consumer, lambda got: len(offsets_in(got, 0)) == 4)
        again = [m for m in after if m.partition() == 0]
        assert [(m.offset(), m.value()) for m in again] == [
            (1, b"p0-1"), (2, b"p0-2"), (3, b"p0-3"), (4, b"p0-4")]
        assert again[0].timestamp() == head.timestamp()
    finally:
        consumer.close()


def test_holds_release_each_partition_at_its_own_time_and_gauge_the_wait_and_age(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic = new_topic(2)
    produce_values(bootstrap, topic, ["due-0", "due-1"], partition=0)
    produce_values(bootstrap, topic, ["in-place-0", "in-place-1"], partition=1)
    consumer = assigned_consumer(bootstrap, unique_name(), topic, 2)
    holds = Holds()
    try:
        first = poll_until(consumer, lambda got: {0, 1} <= {m.partition() for m in got})
        heads = {m.partition(): m for m in reversed(first)}  # each partition's first record
        assert {p: m.offset() for p, m in heads.items()} == {0: 0, 1: 0}
        written = {p: m.timestamp()[1] for p, m in heads.items()}
        start = now_ms()
        holds.hold(consumer, (topic, 0), Hold(0, start + 60_000, Why.DUE, written[0]))
        holds.hold(consumer, (topic, 1), Hold(0, start + HOLD_MS, Why.IN_PLACE, written[1] - 5_000))

        # The wait runs to the soonest hold; only the record held until due ages.
        assert holds.wait_s(start, 30.0) == pytest.approx(HOLD_MS / 1000)
        assert holds.wait_s(start, 0.25) == 0.25
        assert holds.wait_s(start + HOLD_MS + 1, 30.0) == 0.0
        assert holds.oldest_since_ms() == written[0]
        assert start - written[0] < DEADLINE_S * 1000

        # Nothing of either partition while both are held.
        quiet_until = now_ms() + QUIET_MS
        assert where(poll_until(consumer, lambda _: now_ms() >= quiet_until)) == []
        assert holds.release_due(consumer, start + HOLD_MS - 1) == []
        assert holds.release_due(consumer, start + HOLD_MS) == [(topic, 1)]
        assert holds.wait_s(start + HOLD_MS, 120.0) == pytest.approx(60.0 - HOLD_MS / 1000)
        after = poll_until(consumer, lambda got: len(got) == 2, timeout_s=DEADLINE_S)
        assert where(after) == [(1, 0), (1, 1)]
        assert values_of(after) == ["in-place-0", "in-place-1"]
        # p0 is still held: nothing more comes.
        quiet_until = now_ms() + QUIET_MS
        assert where(poll_until(consumer, lambda _: now_ms() >= quiet_until)) == []

        assert holds.release(consumer, [(topic, 0), (topic, 1)]) == [(topic, 0)]
        assert holds.oldest_since_ms() is None
        assert holds.wait_s(now_ms(), 0.25) == 0.25
        assert where(poll_until(consumer, lambda got: len(got) == 2)) == [(0, 0), (0, 1)]
    finally:
        consumer.close()


def test_a_revoke_drops_the_hold_and_the_partition_is_read_again_when_assigned_back(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    # librdkafka keeps a partition's pause flag across unassign and assign: a hold not released
    # on revoke would leave the partition paused for good when it comes back.
    topic = new_topic(2)
    produce_values(bootstrap, topic, ["a0", "a1"], partition=0)
    produce_values(bootstrap, topic, ["b0"], partition=1)
    group = unique_name()
    holds = Holds()
    released: list[list[tuple[str, int]]] = []
    # What the member saw, in order: ("assigned", partitions) or (partition, offset, value).
    seen: list[tuple[object, ...]] = []

    def on_assign(_: Consumer, partitions: list[TopicPartition]) -> None:
        seen.append(("assigned", sorted(p.partition for p in partitions)))

    def on_revoke(consumer_: Consumer, partitions: list[TopicPartition]) -> None:
        released.append(holds.release(consumer_, [(p.topic, p.partition) for p in partitions]))

    def assignments() -> list[object]:
        return [event[1] for event in seen if event[0] == "assigned"]

    def since_last_assignment(partition: int) -> list[tuple[object, ...]]:
        last = max((i for i, event in enumerate(seen) if event[0] == "assigned"), default=0)
        return [event[1:] for event in seen[last:] if event[0] == partition]

    def poll_member(until: Callable[[], bool], *also: Consumer) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, f"gave up after {DEADLINE_S}s: {seen}"
            message = member.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                seen.append((message.partition(), message.offset(), message.value()))
            for consumer_ in also:
                consumer_.poll(0.1)

    member = kafka.consumer(bootstrap, group, FAST_HEARTBEAT)
    member.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    other = kafka.consumer(bootstrap, group, FAST_HEARTBEAT)
    closed: list[Consumer] = []
    try:
        poll_member(lambda: bool(since_last_assignment(0)))
        assert assignments() == [[0, 1]]
        assert since_last_assignment(0)[0] == (0, b"a0")
        holds.hold(member, (topic, 0), Hold(0, now_ms() + 600_000, Why.DUE, now_ms()))
        # A second member joins: the member's partitions are all revoked (eager rebalance).
        other.subscribe([topic])
        poll_member(lambda: len(assignments()) == 2, other)
        assert released == [[(topic, 0)]]
        assert len(holds) == 0 and (topic, 0) not in holds
        # The second member leaves: the member gets both partitions back, p0 unpaused, and
        # reads it from the group's committed offset (none: the beginning).
        other.close()
        closed.append(other)
        poll_member(lambda: len(assignments()) == 3 and len(since_last_assignment(0)) == 2)
        assert assignments()[-1] == [0, 1]
        assert released == [[(topic, 0)], []]
        assert since_last_assignment(0) == [(0, b"a0"), (1, b"a1")]
    finally:
        member.close()
        if other not in closed:
            other.close()
