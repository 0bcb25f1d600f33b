"""Producing: queue a record without failing on a full queue, or produce and wait for the acks."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from redrive.errors import DeliveryFailed, RecordTooLarge, RedriveError
from redrive.kafka.causes import causes, drop_stack, kafka_error
from redrive.kafka.health import UNREACHED_CODES
from redrive.kafka.records import Delivered, OutRecord, record_size

log = logging.getLogger(__name__)

# Makes a record the producer refused as too large smaller, or raises RecordTooLarge.
Shrink = Callable[[OutRecord], OutRecord]


def produce(producer_: Producer, record: OutRecord,
            on_delivery: Any = None, *, shrink: Shrink | None = None,
            wait_s: float | None = None) -> None:
    """Queue one record, waiting for queue space instead of failing when the local queue is full:
    at most `wait_s` (None: as long as it takes), then DeliveryFailed (unanswered). While no
    broker answers, the queue frees only as librdkafka expires its records, after
    message.timeout.ms (five minutes by default), which would hold the caller, and its stop,
    that long.

    A record the producer refuses as too large (over its `message.max.bytes`) raises
    RecordTooLarge, or, with `shrink`, goes out as `shrink` makes it smaller (which raises
    RecordTooLarge itself when it cannot)."""
    partition = record.partition if record.partition is not None and record.partition >= 0 \
        else -1  # librdkafka's "unassigned": the key decides
    headers = record.headers if type(record.headers) is list else list(record.headers)
    give_up_at: float | None = None
    while True:
        try:
            producer_.produce(record.topic, value=record.value, key=record.key,
                              partition=partition, on_delivery=on_delivery,
                              timestamp=record.timestamp_ms or 0, headers=headers)
            return
        except BufferError:
            if wait_s is not None:
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + wait_s
                elif now >= give_up_at:
                    raise DeliveryFailed(record.topic, record.partition,
                                         f"the producer's queue stayed full for {wait_s:g}s: "
                                         "the brokers are not taking records",
                                         unanswered=True) from None
            # Serving the reports that free the queue is where librdkafka raises a fatal error
            # met meanwhile (a broker restart that lost the idempotence state, after an outage
            # filled the queue).
            with _failed_for_good(record.topic):
                producer_.poll(0.05)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError)
                    and error.code() == KafkaError.MSG_SIZE_TOO_LARGE):
                raise
            if shrink is None:
                raise RecordTooLarge(record.topic, record_size(record)) from exc
            record = shrink(record)
            headers = list(record.headers)


def produce_confirmed(producer_: Producer, records: Iterable[OutRecord],
                      timeout_s: float = 30.0, *, shrink: Shrink | None = None) -> list[Delivered]:
    """Produce records and return only once the broker acknowledged every one of them.

    Raises DeliveryFailed naming the first failed record's topic and partition if any delivery
    failed or was still unconfirmed at the timeout; the caller must then not commit past them.
    """
    results: list[Delivered | None] = []
    failures: list[DeliveryFailed] = []

    def callback_for(index: int, topic: str) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(delivery_failed(topic, msg.partition(), err))
            else:
                results[index] = Delivered(str(msg.topic()), int(msg.partition() or 0),
                                           int(msg.offset() or 0))
        return on_delivery

    topics: list[str] = []
    with _queued_delivered_on_error(producer_, timeout_s):
        for index, record in enumerate(records):
            results.append(None)
            topics.append(record.topic)
            produce(producer_, record, callback_for(index, record.topic), shrink=shrink,
                    wait_s=timeout_s)
    remaining = _flush(producer_, timeout_s, topics[0] if topics else "<none>")
    if failures:
        raise failures[0]
    if remaining > 0 or any(result is None for result in results):
        raise DeliveryFailed(_first_topic(results), None,
                             f"{remaining} record(s) unconfirmed after {timeout_s}s",
                             unanswered=True)
    return [result for result in results if result is not None]


def produce_acked(producer_: Producer, records: Iterable[OutRecord],
                  timeout_s: float = 30.0, *, shrink: Shrink | None = None) -> int:
    """`produce_confirmed` for a caller that needs to know only that every record landed, not
    where: one delivery callback serves them all. A callback and a Delivered made per record
    cost about as much as producing it (50,000 copies with 11 headers each: 4-7 us a record
    this way, 10-25 us with produce_confirmed, on noida-db). Returns how many were acked."""
    acked = 0
    failures: list[DeliveryFailed] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        else:
            failures.append(delivery_failed(str(msg.topic()), msg.partition(), err))

    sent = 0
    first_topic = "<none>"
    with _queued_delivered_on_error(producer_, timeout_s):
        for record in records:
            if not sent:
                first_topic = record.topic
            produce(producer_, record, on_delivery, shrink=shrink, wait_s=timeout_s)
            sent += 1
    remaining = _flush(producer_, timeout_s, first_topic)
    if failures:
        raise failures[0]
    if remaining > 0 or acked != sent:
        raise DeliveryFailed(first_topic, None,
                             f"{sent - acked} record(s) unconfirmed after {timeout_s}s",
                             unanswered=True)
    return acked


def produce_each(producer_: Producer, records: Sequence[OutRecord], timeout_s: float = 30.0, *,
                 shrink: Shrink | None = None) -> list[RedriveError | None]:
    """Produce records and wait for every acknowledgement, with each record's own outcome: None
    where the broker took it, else why not (a DeliveryFailed the broker refused it with, a
    RecordTooLarge too large to send even cut). For a caller that settles each record apart, so
    that one record refused again and again does not fail the others with it. Raises
    DeliveryFailed, as produce_acked does, where the broker did not answer or the producer
    failed for good: nothing is known of the others then."""
    outcomes: list[RedriveError | None] = [None] * len(records)
    waiting = len(records)

    def callback_for(index: int, topic: str) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            nonlocal waiting
            waiting -= 1
            if err is not None:
                outcomes[index] = delivery_failed(topic, msg.partition(), err)
        return on_delivery

    for index, record in enumerate(records):
        try:
            produce(producer_, record, callback_for(index, record.topic), shrink=shrink,
                    wait_s=timeout_s)
        except RecordTooLarge as exc:
            outcomes[index] = exc
            waiting -= 1
    first_topic = records[0].topic if records else "<none>"
    remaining = _flush(producer_, timeout_s, first_topic)
    for outcome in outcomes:
        if isinstance(outcome, DeliveryFailed) and (outcome.unanswered or outcome.fatal):
            raise outcome
    if remaining > 0 or waiting > 0:
        raise DeliveryFailed(first_topic, None, f"{waiting} record(s) unconfirmed after "
                             f"{timeout_s}s", unanswered=True)
    return outcomes


@contextlib.contextmanager
def _queued_delivered_on_error(producer_: Producer, timeout_s: float) -> Iterator[None]:
    """Where queueing a run of records fails part way (a record too large, a routing error),
    wait for those already queued before raising: a caller that runs again (a Spark task's next
    attempt, a batch run again) then finds them written, instead of their arriving after it
    looked and being written twice. Not after an outage, whose wait would only double, nor for
    a producer failed for good, which delivers nothing more."""
    try:
        yield
    except Exception as exc:
        if not ((isinstance(exc, DeliveryFailed) and exc.unanswered) or producer_failed(exc)):
            with contextlib.suppress(Exception):
                producer_.flush(timeout_s)
        raise


def _flush(producer_: Producer, timeout_s: float, topic: str) -> int:
    """Wait for every delivery report; what is still queued after the timeout."""
    with _failed_for_good(topic):
        remaining: int = producer_.flush(timeout_s)
    return remaining


@contextlib.contextmanager
def _failed_for_good(topic: str) -> Iterator[None]:
    """Around a call that serves delivery reports (poll, flush): a fatal error met there reaches
    Python as a SystemError caused by it (seen after a noida-db SIGKILL and restart), which
    callers would not take for a failed producer: raised as DeliveryFailed(fatal=True)."""
    try:
        yield
    except SystemError as exc:
        if not producer_failed(exc):
            raise
        drop_stack(exc)
        raise DeliveryFailed(topic, None, f"the producer failed for good: "
                             f"{exc.__cause__ or exc}", fatal=True) from exc


# Codes of a producer failed for good, whether or not the error says fatal(): a record refused
# for a lost idempotence state (a broker restart), after which librdkafka fails the producer,
# and the _FATAL that every later produce() then raises.
_FAILED = frozenset({KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID,
                     KafkaError._FATAL})


def delivery_failed(topic: str, partition: int | None, error: KafkaError) -> DeliveryFailed:
    """The DeliveryFailed for a delivery report's error: unanswered (an outage) or fatal (the
    producer must be replaced) as its code says."""
    why = error.str()
    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        why += f" (the record is larger than {topic!r} takes: its max.message.bytes)"
    return DeliveryFailed(topic, partition, why,
                          unanswered=error.code() in UNREACHED_CODES,
                          fatal=error.fatal() or error.code() in _FAILED)


def producer_failed(exc: BaseException) -> bool:
    """Whether `exc`, from producing, says the producer failed for good (librdkafka's fatal
    error, e.g. its idempotence state lost in a broker restart) and must be replaced: it or an
    exception it was raised from (confluent-kafka raises a delivery callback's error as a
    SystemError caused by it). Also the SystemError of a producer method that returned neither
    a result nor an error ("<method 'flush' of 'cimpl.Producer' objects> returned NULL without
    setting an exception", seen once after a noida-db SIGKILL and restart, where the producer
    failed fatally): nothing says that producer is sound, and what it holds is unconfirmed
    either way. A SystemError caused by something else (a bug in a callback) is not this."""
    if isinstance(exc, SystemError) and exc.__cause__ is None and "cimpl.Producer" in str(exc):
        return True
    for seen in causes(exc):
        if isinstance(seen, DeliveryFailed):
            if seen.fatal:
                return True
        else:
            error = kafka_error(seen)
            if error is not None and (error.fatal() or error.code() in _FAILED):
                return True
    return False


# The group coordinator's answers to offsets sent with a consumer's group metadata that a
# rebalance made stale. librdkafka makes them abortable, not retriable, yet nothing of the
# records is refused: the consumer's next poll joins the new generation (or, for a fenced static
# member, fails for good), and the next transaction sends its metadata.
_REBALANCED = frozenset({KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                         KafkaError.FENCED_INSTANCE_ID, KafkaError.REBALANCE_IN_PROGRESS})


def passing_failure(exc: BaseException) -> bool:
    """Whether `exc`, from a transaction, or an exception it was raised from, says the
    producer was in a passing state rather than that the brokers refused what it produced
    (which they would refuse again): librdkafka's erroneous state (seen once in CI just after
    aborts: "Failed to commit offsets to transaction on broker (none): Local: Erroneous
    state"), offsets sent for a group generation a rebalance ended, or an error marked
    retriable. Any other answer counts as a refusal, so that an error not foreseen here holds
    its partitions instead of handling their records again as fast as the loop runs."""
    for seen in causes(exc):
        error = kafka_error(seen)
        if error is not None:
            return error.code() == KafkaError._STATE or error.code() in _REBALANCED \
                or error.retriable()
    return False


def flush_closing(producer_: Producer, timeout_s: float, owner: str) -> None:
    """Flush a producer being closed. One that failed for good (fatally, or fenced) raises its
    error from the flush, yet has nothing left it could deliver: that error is logged, not
    raised, or it would skip the rest of the owner's close and, raised from a `finally`, hide
    the error that stopped the owner."""
    try:
        producer_.flush(timeout_s)
    except (KafkaException, SystemError) as exc:
        if not producer_failed(exc):
            raise
        drop_stack(exc)
        log.warning("closing the producer of %s, which failed for good: %s", owner,
                    exc.__cause__ or exc)


def discard_producer(producer_: Producer | None) -> None:
    """Drop a producer without delivering what it still holds: the caller takes that up
    again (rewinds it, or finds it pending), and a late delivery would only duplicate it."""
    if producer_ is not None:
        with contextlib.suppress(KafkaException, RuntimeError):
            producer_.purge()


def _first_topic(results: Sequence[Delivered | None]) -> str:
    return next((r.topic for r in results if r is not None), "<unconfirmed>")
