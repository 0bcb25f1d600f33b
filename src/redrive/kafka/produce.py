"""Producing: queue a record without failing on a full queue, or produce and wait for the acks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from redrive.errors import DeliveryFailed
from redrive.kafka.health import UNREACHED_CODES
from redrive.kafka.records import Delivered, OutRecord


def produce(producer_: Producer, record: OutRecord,
            on_delivery: Any = None) -> None:
    """Queue one record, waiting for queue space instead of failing when the local queue is full."""
    kwargs: dict[str, Any] = {"value": record.value, "key": record.key,
                              "headers": list(record.headers)}
    if record.partition is not None and record.partition >= 0:
        kwargs["partition"] = record.partition
    if record.timestamp_ms is not None:
        kwargs["timestamp"] = record.timestamp_ms
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    while True:
        try:
            producer_.produce(record.topic, **kwargs)
            return
        except BufferError:
            producer_.poll(0.05)


def produce_confirmed(producer_: Producer, records: Iterable[OutRecord],
                      timeout_s: float = 30.0) -> list[Delivered]:
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
    for index, record in enumerate(records):
        results.append(None)
        topics.append(record.topic)
        produce(producer_, record, callback_for(index, record.topic))
    try:
        remaining = producer_.flush(timeout_s)
    except SystemError as exc:
        # A fatal error met while serving delivery reports reaches Python as a SystemError
        # caused by it (seen after a noida-db SIGKILL and restart): said as what it is.
        if not producer_failed(exc):
            raise
        raise DeliveryFailed(topics[0] if topics else "<none>", None,
                             f"the producer failed for good: {exc.__cause__}",
                             fatal=True) from exc
    if failures:
        raise failures[0]
    if remaining > 0 or any(result is None for result in results):
        raise DeliveryFailed(_first_topic(results), None,
                             f"{remaining} record(s) unconfirmed after {timeout_s}s",
                             unanswered=True)
    return [result for result in results if result is not None]


# Codes of a producer failed for good, whether or not the error says fatal(): a record refused
# for a lost idempotence state (a broker restart), after which librdkafka fails the producer,
# and the _FATAL that every later produce() then raises.
_FAILED = frozenset({KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID,
                     KafkaError._FATAL})


def delivery_failed(topic: str, partition: int | None, error: KafkaError) -> DeliveryFailed:
    """The DeliveryFailed for a delivery report's error: unanswered (an outage) or fatal (the
    producer must be replaced) as its code says."""
    return DeliveryFailed(topic, partition, error.str(),
                          unanswered=error.code() in UNREACHED_CODES,
                          fatal=error.fatal() or error.code() in _FAILED)


def producer_failed(exc: BaseException) -> bool:
    """Whether `exc`, from producing, says the producer failed for good (librdkafka's fatal
    error, e.g. its idempotence state lost in a broker restart) and must be replaced: it or an
    exception it was raised from (confluent-kafka raises a delivery callback's error as a
    SystemError caused by it)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DeliveryFailed):
            if seen.fatal:
                return True
        else:
            error = seen.args[0] if isinstance(seen, KafkaException) and seen.args else None
            if isinstance(error, KafkaError) and (error.fatal() or error.code() in _FAILED):
                return True
        seen = seen.__cause__
    return False


def discard_producer(producer_: Producer | None) -> None:
    """Drop a producer without delivering what it still holds: the caller takes that up
    again (rewinds it, or finds it pending), and a late delivery would only duplicate it."""
    if producer_ is not None:
        with contextlib.suppress(KafkaException, RuntimeError):
            producer_.purge()


def _first_topic(results: Sequence[Delivered | None]) -> str:
    return next((r.topic for r in results if r is not None), "<unconfirmed>")
