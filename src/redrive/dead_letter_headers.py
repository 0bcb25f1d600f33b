"""The story of a dead-letter record, whichever system wrote it: redrive, Spring Kafka, Kafka
Connect or Kafka Streams, each recognised by its own header set.

redrive's headers are read strictly (a malformed one raises MalformedHeader); the other systems'
sets leniently, since redrive only reads them to show and replay what those systems dead-lettered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redrive.headers import (
    ERROR_MESSAGE,
    ERROR_TRACE,
    ERROR_TYPE,
    REASON,
    last,
    read_delivery,
    text_of,
)
from redrive.record import Origin


@dataclass(frozen=True)
class DeadLetterInfo:
    """The story of a dead-letter record, whichever system wrote it."""

    system: str  # "redrive", "spring", "connect", "streams"
    original: Origin | None
    error_type: str | None
    error_message: str | None
    error_trace: str | None
    attempts: int | None = None
    group: str | None = None
    reason: str | None = None


def _lenient_int(raw: bytes | None) -> int | None:
    """Spring writes big-endian binary integers; Connect and Streams write decimal text."""
    if raw is None or raw == b"":
        return None
    if raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit()):
        return int(raw)
    return int.from_bytes(raw, "big", signed=True)


def _lenient_text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _origin(topic: str | None, partition: int | None, offset: int | None,
            timestamp: int | None = None) -> Origin | None:
    if topic is None or partition is None or offset is None:
        return None
    return Origin(topic, partition, offset, timestamp)


def _read_redrive(headers: Sequence[tuple[str, bytes]]) -> DeadLetterInfo | None:
    if last(headers, REASON) is None and last(headers, ERROR_TYPE) is None:
        return None
    delivery = read_delivery(headers)
    return DeadLetterInfo(
        "redrive", delivery.original, text_of(headers, ERROR_TYPE), text_of(headers, ERROR_MESSAGE),
        text_of(headers, ERROR_TRACE), delivery.attempt, delivery.group, text_of(headers, REASON))


def _read_spring(headers: Sequence[tuple[str, bytes]]) -> DeadLetterInfo | None:
    for prefix, error_prefix in (("kafka_dlt-original-", "kafka_dlt-exception-"),
                                 ("kafka_original-", "kafka_exception-")):
        topic = last(headers, prefix + "topic")
        if topic is None:
            continue
        original = _origin(_lenient_text(topic), _lenient_int(last(headers, prefix + "partition")),
                           _lenient_int(last(headers, prefix + "offset")),
                           _lenient_int(last(headers, prefix + "timestamp")))
        error_type = (last(headers, error_prefix + "fqcn")
                      or last(headers, error_prefix + "cause-fqcn"))
        return DeadLetterInfo(
            "spring", original, _lenient_text(error_type),
            _lenient_text(last(headers, error_prefix + "message")),
            _lenient_text(last(headers, error_prefix + "stacktrace")),
            _lenient_int(last(headers, "retry_topic-attempts")),
            _lenient_text(last(headers, prefix + "consumer-group")))
    return None


def _read_prefixed(headers: Sequence[tuple[str, bytes]], system: str, prefix: str,
                   type_header: str, message_header: str,
                   trace_header: str) -> DeadLetterInfo | None:
    topic = last(headers, prefix + "topic")
    error_type = last(headers, prefix + type_header)
    if topic is None and error_type is None:
        return None
    original = _origin(_lenient_text(topic), _lenient_int(last(headers, prefix + "partition")),
                       _lenient_int(last(headers, prefix + "offset")))
    return DeadLetterInfo(
        system, original, _lenient_text(error_type),
        _lenient_text(last(headers, prefix + message_header)),
        _lenient_text(last(headers, prefix + trace_header)))


def read_dead_letter(headers: Sequence[tuple[str, bytes]]) -> DeadLetterInfo | None:
    """Where a dead-letter record came from and why, from the first header set that is present.

    Raises MalformedHeader only for redrive's own headers; other systems' sets are read leniently.
    """
    found = _read_redrive(headers) or _read_spring(headers)
    if found is not None:
        return found
    connect = _read_prefixed(headers, "connect", "__connect.errors.", "exception.class.name",
                             "exception.message", "exception.stacktrace")
    if connect is not None:
        return connect
    return _read_prefixed(headers, "streams", "__streams.errors.", "exception", "message",
                          "stacktrace")
