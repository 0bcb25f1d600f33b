"""Non-blocking retries on noida-db: success, retry then success, exhaustion, not retryable,
malformed headers, and the due gate holding a partition while the others go on."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from redrive import headers as h
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.topics import plan

from .conftest import FAST_GROUP, Handled, Running, committed, produce, read_all, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Transient(Exception):
    pass


class Permanent(ValueError):
    pass


def test_successes_are_committed_and_counted(bootstrap: str, new_topic: NewTopic,
                                             unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("ok")
    produce(bootstrap, topic, [b"a", b"b", b"c"], partition=0)
    produce(bootstrap, topic, [b"d", b"e"], partition=1)
    seen = Handled()
    run = running(RetryingConsumer(bootstrap, topic, group, RetryPolicy(), seen.add,
                                   config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 5, 20, "5 processed")
    run.stop()
    assert sorted(v or b"" for v in seen.values()) == [b"a", b"b", b"c", b"d", b"e"]
    assert committed(bootstrap, group, topic) == {0: 3, 1: 2}
    assert run.total("redrive_retried_total") == 0


def test_retry_then_success_and_exhaustion_to_dead_letter(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("retry")
    policy = RetryPolicy(backoff=Backoff.sequence("300ms,600ms"))  # 3 attempts
    failures = {b"once": 1, b"twice": 2, b"always": 99}
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if seen.count(record.value or b"") <= failures.get(record.value or b"", 0):
            raise Transient(f"attempt {record.delivery.attempt} of {record.value!r}")

    produce(bootstrap, topic, [b"fine", b"once", b"twice", b"always"], partition=1)
    started_ms = time.time_ns() // 1_000_000
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 3
               and run.total("redrive_dead_lettered_total") == 1, 30, "3 processed, 1 dead")
    run.stop()

    assert [seen.count(v) for v in (b"fine", b"once", b"twice", b"always")] == [1, 2, 3, 3]
    metrics = run.consumer.metrics
    assert metrics.value("redrive_retried_total", topic=topic, attempt="1") == 3
    assert metrics.value("redrive_retried_total", topic=topic, attempt="2") == 2
    assert metrics.value("redrive_dead_lettered_total", topic=topic, reason="exhausted") == 1

    # Each retry waited at least its delay after the failure before it.
    for record, at_ms in seen.calls:
        if record.delivery.due_ms is not None:
            assert at_ms >= record.delivery.due_ms
            assert record.delivery.original is not None
            assert (record.delivery.original.topic, record.delivery.original.partition) \
                == (topic, 1)
            assert record.partition == 1  # the copy kept its partition

    topic_plan = plan(policy, topic, group)
    dead = read_all(bootstrap, topic_plan.dead_letter or "", expect=1)
    assert [d.value for d in dead] == [b"always"]
    letter = dead[0]
    assert letter.partition == 1
    assert letter.header(h.REASON) == "exhausted"
    assert letter.header(h.ATTEMPT) == "3"
    assert letter.header(h.GROUP) == group
    assert letter.header(h.ORIGINAL_TOPIC) == topic
    assert letter.header(h.ORIGINAL_OFFSET) == "3"
    assert "Transient" in (letter.header(h.ERROR_TYPE) or "")
    assert letter.header(h.DUE) is None
    assert int(letter.header(h.FIRST_FAILURE) or 0) >= started_ms
    retried = {name: len(read_all(bootstrap, name)) for name in topic_plan.retry_topic_names}
    assert retried == {f"{topic}.{group}.retry.300ms": 3, f"{topic}.{group}.retry.600ms": 2}
    assert committed(bootstrap, group, topic) == {0: -1001, 1: 4}


def test_each_failure_of_a_slow_batch_is_stamped_with_the_time_it_failed(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    # First failures are routed from one template per batch and error; their first-failure
    # and due times must still be each record's own, or a slow batch would shorten the backoff.
    topic, group = new_topic(), unique_name("slow")
    policy = RetryPolicy(backoff=Backoff.fixed("30s"))
    failed_at: dict[bytes, int] = {}

    def handler(record: Record) -> None:
        time.sleep(0.3)
        failed_at[record.value or b""] = time.time_ns() // 1_000_000
        raise Transient("the same error for every record")

    produce(bootstrap, topic, [b"a", b"b", b"c"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    copies = read_all(bootstrap, f"{topic}.{group}.retry.30s", expect=3, timeout_s=20)
    wait_until(lambda: run.total("redrive_retried_total") == 3, 10, "3 retries counted")
    run.stop()

    firsts = []
    for copy in sorted(copies, key=lambda c: int(c.header(h.ORIGINAL_OFFSET) or -1)):
        first = int(copy.header(h.FIRST_FAILURE) or 0)
        assert failed_at[copy.value or b""] <= first <= failed_at[copy.value or b""] + 1000
        assert int(copy.header(h.DUE) or 0) == first + 30_000
        assert copy.header(h.ERROR_MESSAGE) == "the same error for every record"
        firsts.append(first)
    assert [b - a >= 250 for a, b in itertools.pairwise(firsts)] == [True, True]
    assert committed(bootstrap, group, topic) == {0: 3}


def test_not_retryable_and_malformed_go_straight_to_dead_letter(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("dlt")
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=5, not_retryable=Permanent)
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"bad":
            raise Permanent("cannot parse")

    produce(bootstrap, topic, [b"bad", b"good"])
    produce(bootstrap, topic, [b"garbled"], headers=[(h.ATTEMPT, b"three")])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 2, 20, "2 dead letters")
    run.stop()

    assert seen.values() == [b"bad", b"good"]  # the malformed record never reached the handler
    metrics = run.consumer.metrics
    assert metrics.value("redrive_dead_lettered_total", topic=topic, reason="not-retryable") == 1
    assert metrics.value("redrive_dead_lettered_total", topic=topic, reason="malformed") == 1
    assert run.total("redrive_retried_total") == 0
    dead = read_all(bootstrap, f"{topic}.{group}.dlt", expect=2)
    reasons = {d.value: d.header(h.REASON) for d in dead}
    assert reasons == {b"bad": "not-retryable", b"garbled": "malformed"}
    assert committed(bootstrap, group, topic) == {0: 3}


def test_a_held_retry_partition_does_not_block_the_main_topic(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("hold")
    # long enough that the main topic's records clearly pass first, even on a loaded machine
    policy = RetryPolicy(backoff=Backoff.fixed("3s"), attempts=2)
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"slow" and record.delivery.attempt == 0:
            raise Transient("later")

    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    produce(bootstrap, topic, [b"slow"])
    wait_until(lambda: run.total("redrive_retried_total") == 1, 20, "the first failure")
    wait_until(lambda: run.consumer.metrics.value("redrive_paused_partitions") == 1, 5,
               "the retry partition paused")
    produce(bootstrap, topic, [f"m{i}".encode() for i in range(20)])
    wait_until(lambda: run.total("redrive_processed_total") == 21, 20, "all processed")
    run.stop()
    values = seen.values()
    # The main topic's records went through while the retry waited for its due time.
    assert values.index(b"m19") < len(values) - 1
    assert values[-1] == b"slow"
    retried, at_ms = seen.calls[-1]
    assert retried.delivery.due_ms is not None and at_ms >= retried.delivery.due_ms


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise AttributeError("the message needs an attribute the error lacks")


def test_errors_whose_text_fails_or_is_not_utf8_are_routed_and_the_consumer_goes_on(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    """Before, such an error ended run() (UnicodeEncodeError, or its own __str__'s error), and
    its record did so again at every restart."""
    topic, group = new_topic(), unique_name("texts")
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=2)

    path = b"/data/caf\xe9".decode("utf-8", "surrogateescape")  # a file name, not UTF-8

    def handler(record: Record) -> None:
        if record.value == b"unprintable":
            raise UnprintableError()
        if record.value == b"undecodable":
            raise RuntimeError(f"cannot read {path}")

    produce(bootstrap, topic, [b"unprintable", b"undecodable", b"fine"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    dead = {d.value: d for d in read_all(bootstrap, f"{topic}.{group}.dlt", expect=2,
                                         timeout_s=20)}
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 3}, 10, "all committed")
    run.stop()
    assert {value: d.header(h.REASON) for value, d in dead.items()} == \
        {b"unprintable": "exhausted", b"undecodable": "exhausted"}
    assert dead[b"unprintable"].header(h.ERROR_MESSAGE) == \
        "<str() of the error failed: AttributeError>"
    assert dead[b"undecodable"].header(h.ERROR_MESSAGE) == "cannot read /data/caf\\udce9"
    assert run.total("redrive_processed_total") == 1


def test_a_handler_that_does_not_await_its_coroutine_fails_its_records_instead_of_passing_them(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    """The first delivery goes through the plain-record loop, the retry through the runtime's:
    both fail the record, so it ends in the dead-letter topic instead of counting as handled."""
    topic, group = new_topic(), unique_name("unawaited")
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=2)
    ran: list[bytes | None] = []

    async def handle(record: Record) -> None:
        ran.append(record.value)

    produce(bootstrap, topic, [b"a", b"b"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy,
                                   lambda record: handle(record), config=FAST_GROUP))
    dead = read_all(bootstrap, f"{topic}.{group}.dlt", expect=2, timeout_s=20)
    run.stop()
    assert ran == []
    assert sorted(d.value for d in dead) == [b"a", b"b"]
    assert {(d.header(h.REASON), d.header(h.ERROR_TYPE)) for d in dead} == \
        {("exhausted", "TypeError")}
    assert {d.header(h.ERROR_MESSAGE) for d in dead} == {
        "the handler returned coroutine, an awaitable, which redrive does not await: its "
        "record was not handled"}
    assert run.total("redrive_processed_total") == 0
    assert run.total("redrive_retried_total") == 2


def test_retry_copies_are_read_whatever_auto_offset_reset_says(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    """auto.offset.reset is the user's say over the main topics. A retry partition the group
    has committed nothing on holds only the group's own unfinished copies, so it is read from
    its start: at `latest`, a member stopped before it committed there left its copies behind."""
    topic, group = new_topic(partitions=1), unique_name("reset")
    policy = RetryPolicy(backoff=Backoff.sequence("2s"))
    config = {**FAST_GROUP, "auto.offset.reset": "latest"}
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"fail" and record.delivery.attempt == 0:
            raise Transient("first try")

    def consumer() -> RetryingConsumer:
        return RetryingConsumer(bootstrap, topic, group, policy, handler, config=config)

    first = running(consumer())
    # At latest, only records produced once the member has its partition are read.
    deadline = time.monotonic() + 30
    while first.total("redrive_processed_total") == 0 and time.monotonic() < deadline:
        produce(bootstrap, topic, [b"warm"])
        time.sleep(0.5)
    produce(bootstrap, topic, [b"fail"])
    wait_until(lambda: first.total("redrive_retried_total") == 1, 20, "the copy")
    first.stop()  # before the copy is due: nothing committed on the retry partition
    assert seen.count(b"fail") == 1

    second = running(consumer())
    wait_until(lambda: seen.count(b"fail") == 2, 30, "the retry handled after the restart")
    second.stop()
    retry_topic = plan(policy, topic, group).retry_topic_names[0]
    assert committed(bootstrap, group, retry_topic) == {0: 1}
