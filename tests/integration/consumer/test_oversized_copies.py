"""A failed record near its size limit: its copies go out with their error text cut, the record
whole; one that cannot be copied at all stops the consumer naming it, and nothing past it is
committed."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.errors import RecordTooLarge
from redrive.oversize import CUT_NOTE, MESSAGE_KEPT
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.topics import plan

from ..topic_configs import set_record_limit
from .conftest import FAST_GROUP, Running, committed, produce, read_all, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]

LIMIT = 100_000  # the message.max.bytes of redrive's producer in these tests
LONG_MESSAGE = "the upstream answered: " + "x" * 900  # within the policy's 1,024 bytes


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
def test_a_copy_over_the_producers_limit_goes_out_with_its_error_text_cut(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        transactional: bool) -> None:
    topic, group = new_topic(), unique_name("oversized")
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=2)
    retry, dlt = plan(policy, topic, group).retry_topic_names[0], f"{topic}.{group}.dlt"
    big = b"v" * (LIMIT - 1000)  # fits with redrive's headers, not with the long message too
    produce(bootstrap, topic, [b"small"], key=b"k0")
    produce(bootstrap, topic, [big], key=b"k1")
    produce(bootstrap, topic, [b"fine"], key=b"k2")
    calls: list[tuple[bytes | None, int]] = []

    def handle(record: Record) -> None:
        calls.append((record.key, record.delivery.attempt))
        if record.key != b"k2":
            raise ValueError(LONG_MESSAGE)

    consumer = running(RetryingConsumer(
        bootstrap, topic, group, policy, handle, transactional=transactional,
        transactional_id=unique_name("tx") if transactional else None, config=FAST_GROUP,
        producer_config={"message.max.bytes": LIMIT}))
    dead = read_all(bootstrap, dlt, expect=2, timeout_s=30)
    consumer.stop()

    assert sorted(calls) == [(b"k0", 0), (b"k0", 1), (b"k1", 0), (b"k1", 1), (b"k2", 0)]
    retried = {read.key: read for read in read_all(bootstrap, retry, expect=2)}
    for copies in (retried, {read.key: read for read in dead}):
        assert set(copies) == {b"k0", b"k1"}
        whole, cut = copies[b"k0"], copies[b"k1"]
        assert (whole.value, cut.value) == (b"small", big)
        assert whole.header(h.ERROR_MESSAGE) == LONG_MESSAGE
        assert "Traceback" in (whole.header(h.ERROR_TRACE) or "")
        assert cut.header(h.ERROR_TRACE) == CUT_NOTE.decode()
        message = cut.header(h.ERROR_MESSAGE) or ""
        assert message.startswith("the upstream answered: xxx") and message.endswith("…")
        assert len(message.encode()) <= MESSAGE_KEPT
        assert (cut.header(h.ERROR_TYPE), cut.header(h.ORIGINAL_OFFSET)) == ("ValueError", "1")
    assert dead[0].header(h.REASON) == dead[1].header(h.REASON) == "exhausted"
    assert committed(bootstrap, group, topic) == {0: 3}
    assert committed(bootstrap, group, retry) == {0: 2}


def test_a_record_too_large_to_copy_stops_the_consumer_naming_it_and_nothing_past_it_commits(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        caplog: pytest.LogCaptureFixture) -> None:
    # The topic takes records of up to 2 MB; redrive's producer is left at its default, 1 MB.
    topic = new_topic(config={"max.message.bytes": "2000000"})
    group = unique_name("oversized")
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), not_retryable=ValueError)
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, [b"a"], key=b"k0")
    big_producer = kafka.producer(bootstrap, overrides={"message.max.bytes": 3_000_000})
    kafka.produce_confirmed(big_producer, [kafka.OutRecord(topic, b"v" * 1_200_000, b"k1")])
    produce(bootstrap, topic, [b"c"], key=b"k2")

    def handle(record: Record) -> None:
        if record.key == b"k1":
            raise ValueError("cannot be parsed")

    caplog.set_level(logging.WARNING, logger="redrive.consumer")
    small = running(RetryingConsumer(bootstrap, topic, group, policy, handle, config=FAST_GROUP))
    wait_until(lambda: not small.thread.is_alive(), 30, "the consumer to stop on the record")
    assert isinstance(small.error, RecordTooLarge)
    assert small.error.origin == f"{topic}[0]@1"
    assert f"the copy of {topic}[0]@1 for topic {dlt!r}" in str(small.error)
    small.error = None  # seen: the fixture fails a test on a run's error left unseen
    warned = [r.getMessage() for r in caplog.records if "redrive's clients send at most" in
              r.getMessage()]
    assert warned == [f"{topic} takes records up to 2,000,000 bytes, but redrive's clients "
                      "send at most 1,000,000 (message.max.bytes): a failed record larger than "
                      "that cannot be copied; set message.max.bytes to at least 2,000,000 in the "
                      "settings of redrive's producer"]
    assert committed(bootstrap, group, topic)[0] <= 1  # nothing past the record
    assert kafka.record_limits(kafka.admin(bootstrap), [dlt])[dlt].bytes == 2_000_000

    # With the limit raised, the same group goes on from there and loses nothing.
    running(RetryingConsumer(bootstrap, topic, group, policy, handle, config=FAST_GROUP,
                             producer_config={"message.max.bytes": 3_000_000}))
    dead = read_all(bootstrap, dlt, expect=1, timeout_s=30)
    assert [(read.key, len(read.value or b""), read.header(h.REASON)) for read in dead] == \
        [(b"k1", 1_200_000, "not-retryable")]
    assert "Traceback" in (dead[0].header(h.ERROR_TRACE) or "")
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 3}, 20, "all three committed")


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
def test_a_copy_its_topic_refuses_holds_its_partition_with_growing_pauses_until_it_fits(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        transactional: bool) -> None:
    """The dead-letter topic takes less than the source topic (it existed before): the broker
    refuses the copy. The partition waits 1 s, then 2 s... before the record is handled again,
    instead of calling the handler as fast as the loop runs; the other partition goes on; once
    the topic takes the copy, the record goes through without a restart."""
    topic = new_topic(partitions=2, config={"max.message.bytes": "2000000"})
    group = unique_name("refused")
    dlt = new_topic(name=f"{topic}.{group}.dlt")  # the cluster's default limit, about 1 MB
    policy = RetryPolicy(not_retryable=ValueError)
    big_producer = kafka.producer(bootstrap, overrides={"message.max.bytes": 3_000_000})
    kafka.produce_confirmed(big_producer, [kafka.OutRecord(topic, b"v" * 1_200_000, b"big", [],
                                                           0)])
    calls: list[tuple[bytes | None, int]] = []
    big_at: list[float] = []

    def handle(record: Record) -> None:
        calls.append((record.key, record.partition))
        if record.key == b"big":
            big_at.append(time.monotonic())
            raise ValueError("cannot be parsed")

    running(RetryingConsumer(
        bootstrap, topic, group, policy, handle, transactional=transactional,
        transactional_id=unique_name("tx") if transactional else None, config=FAST_GROUP,
        producer_config={"message.max.bytes": 3_000_000}))
    wait_until(lambda: (b"big", 0) in calls, 20, "the big record handled once")
    for i in range(5):
        produce(bootstrap, topic, [b"small"], key=f"s{i}".encode(), partition=1)
    wait_until(lambda: committed(bootstrap, group, topic).get(1) == 5, 20,
               "the other partition handled and committed")
    time.sleep(4)
    # Handled at 0 s, about 1 s, about 3 s...: not dozens of times a second. A transaction can
    # first fail as librdkafka's erroneous state, before the refusal is reported (a passing
    # failure, rewound at once: seen in CI under load); its next try meets the refusal itself.
    gaps = [later - earlier for earlier, later in itertools.pairwise(big_at)]
    at_once = [gap for gap in gaps if gap < 0.5]
    paused = [gap for gap in gaps if gap >= 0.5]
    assert len(at_once) <= (1 if transactional else 0), gaps
    assert paused and paused[0] >= 0.9 and paused == sorted(paused), gaps
    assert committed(bootstrap, group, topic)[0] < 1
    assert read_all(bootstrap, dlt, timeout_s=2) == []

    set_record_limit(bootstrap, dlt, 2_000_000)
    dead = read_all(bootstrap, dlt, expect=1, timeout_s=20)
    assert [(read.key, len(read.value or b"")) for read in dead] == [(b"big", 1_200_000)]
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 1, 1: 5}, 20,
               "the big record committed")


def test_the_records_before_a_refused_copys_record_are_committed_and_not_handled_again(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    """At-least-once, a refused copy's batch is kept up to that copy's record: the records read
    before it are committed, and only it and those after it come back at each try. (In one
    transaction the refusal aborts every copy of the batch: all of it comes back.)"""
    topic, group = new_topic(), unique_name("refused-prefix")
    dlt = new_topic(name=f"{topic}.{group}.dlt", config={"max.message.bytes": "2000"})
    produce(bootstrap, topic, [b"ok", b"ok", b"x" * 5_000, b"ok"], partition=0)  # one batch
    calls: list[int] = []

    def handle(record: Record) -> None:
        calls.append(record.offset)
        if record.offset == 2:
            raise ValueError("cannot be parsed")

    running(RetryingConsumer(bootstrap, topic, group, RetryPolicy(not_retryable=ValueError),
                             handle, config=FAST_GROUP))
    wait_until(lambda: calls.count(2) >= 3, 20, "the refused record's third try")
    assert committed(bootstrap, group, topic) == {0: 2}
    assert calls.count(0) == calls.count(1) == 1, calls
    assert calls.count(3) >= calls.count(2) - 1, calls  # it comes back with the refused one

    set_record_limit(bootstrap, dlt, 2_000_000)
    dead = read_all(bootstrap, dlt, expect=1, timeout_s=20)
    assert [len(read.value or b"") for read in dead] == [5_000]
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 4}, 20, "all four committed")
    assert calls.count(0) == calls.count(1) == 1, calls
