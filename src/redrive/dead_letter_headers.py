"""The story of a dead-letter record, whichever system wrote it: redrive, Spring Kafka, Kafka
Connect, Kafka Streams, a share group's dead-letter queue (KIP-1191) or Karafka, each recognised by
its own header set; and Spring Kafka's set written beside redrive's, for Java readers.

redrive's headers are read strictly (a malformed one raises MalformedHeader); the other systems'
sets leniently, since redrive only reads them to show and replay what those systems dead-lettered.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from redrive.errors import MalformedHeader
from redrive.headers import (
    ERROR_MESSAGE,
    ERROR_TRACE,
    ERROR_TYPE,
    REASON,
    cut,
    last,
    read_delivery,
    text_of,
)
from redrive.record import ErrorInfo, Origin

SPRING_ORIGINAL = "kafka_dlt-original-"
SPRING_EXCEPTION = "kafka_dlt-exception-"
SPRING_RETRY_ORIGINAL = "kafka_original-"  # Spring's retry topics, before the dead-letter topic
SPRING_RETRY_EXCEPTION = "kafka_exception-"
SPRING_ATTEMPTS = "retry_topic-attempts"
# Spring writes these as big-endian binary numbers: a 4-byte int or an 8-byte long.
_SPRING_INTS = frozenset(prefix + name for prefix in (SPRING_ORIGINAL, SPRING_RETRY_ORIGINAL)
                         for name in ("partition", "offset", "timestamp")) | {SPRING_ATTEMPTS}
SHARE_GROUP = "__dlq.errors."  # KIP-1191: a share group's dead-letter queue, written by the broker
KARAFKA = "source_"


@dataclass(frozen=True)
class DeadLetterInfo:
    """The story of a dead-letter record, whichever system wrote it."""

    system: str  # "redrive", "spring", "connect", "streams", "share-group", "karafka"
    original: Origin | None
    error_type: str | None
    error_message: str | None
    error_trace: str | None
    attempts: int | None = None
    group: str | None = None
    reason: str | None = None
    # The type of the error's cause, where the writer names it apart (Spring's
    # exception-cause-fqcn): a selection by error type looks at both.
    cause_type: str | None = None


def _lenient_int(raw: bytes | None) -> int | None:
    """Spring writes big-endian binary integers; Connect and Streams write decimal text. A
    number out of its column's range is kept here, to be named as such; text of more digits
    than int() reads (4,300) is left out."""
    if raw is None or raw == b"":
        return None
    if raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit()):
        try:
            return int(raw)
        except ValueError:
            return None
    return int.from_bytes(raw, "big", signed=True)


def _lenient_text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _origin(topic: str | None, partition: int | None, offset: int | None,
            timestamp: int | None = None) -> Origin | None:
    if topic is None or partition is None or offset is None:
        return None
    return Origin(topic, partition, offset, timestamp)


def _read_redrive(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    if last(headers, REASON) is None and last(headers, ERROR_TYPE) is None:
        return None
    delivery = read_delivery(headers)
    return DeadLetterInfo(
        "redrive", delivery.original, text_of(headers, ERROR_TYPE), text_of(headers, ERROR_MESSAGE),
        text_of(headers, ERROR_TRACE), delivery.attempt, delivery.group, text_of(headers, REASON))


def _read_spring(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    for prefix, error_prefix in ((SPRING_ORIGINAL, SPRING_EXCEPTION),
                                 (SPRING_RETRY_ORIGINAL, SPRING_RETRY_EXCEPTION)):
        topic = last(headers, prefix + "topic")
        if topic is None:
            continue
        original = _origin(_lenient_text(topic), _lenient_int(last(headers, prefix + "partition")),
                           _lenient_int(last(headers, prefix + "offset")),
                           _lenient_int(last(headers, prefix + "timestamp")))
        cause = last(headers, error_prefix + "cause-fqcn")
        return DeadLetterInfo(
            "spring", original, _lenient_text(last(headers, error_prefix + "fqcn") or cause),
            _lenient_text(last(headers, error_prefix + "message")),
            _lenient_text(last(headers, error_prefix + "stacktrace")),
            _lenient_int(last(headers, SPRING_ATTEMPTS)),
            _lenient_text(last(headers, prefix + "consumer-group")),
            cause_type=_lenient_text(cause))
    return None


def _read_prefixed(headers: Sequence[tuple[str, bytes | None]], system: str, prefix: str,
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


def _read_share_group(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    # The broker writes no error type: the consumer only rejected the record, or stopped
    # acknowledging it until its delivery count ran out.
    topic = last(headers, SHARE_GROUP + "topic")
    if topic is None:
        return None
    original = _origin(_lenient_text(topic), _lenient_int(last(headers, SHARE_GROUP + "partition")),
                       _lenient_int(last(headers, SHARE_GROUP + "offset")))
    return DeadLetterInfo(
        "share-group", original, None, _lenient_text(last(headers, SHARE_GROUP + "message")),
        None, _lenient_int(last(headers, SHARE_GROUP + "delivery.count")),
        _lenient_text(last(headers, SHARE_GROUP + "group")))


def _read_karafka(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    topic = last(headers, KARAFKA + "topic")
    if topic is None:
        return None
    original = _origin(_lenient_text(topic), _lenient_int(last(headers, KARAFKA + "partition")),
                       _lenient_int(last(headers, KARAFKA + "offset")))
    return DeadLetterInfo("karafka", original, None, None, None, None,
                          _lenient_text(last(headers, KARAFKA + "consumer_group")))


def _read_connect(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    return _read_prefixed(headers, "connect", "__connect.errors.", "exception.class.name",
                          "exception.message", "exception.stacktrace")


def _read_streams(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    return _read_prefixed(headers, "streams", "__streams.errors.", "exception", "message",
                          "stacktrace")


# In order of precedence: a record redrive dead-lettered may carry Spring's set beside its own,
# and one another system dead-lettered first keeps that system's set when redrive routes it.
_READERS = (_read_redrive, _read_spring, _read_connect, _read_streams, _read_share_group,
            _read_karafka)


def read_dead_letter(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo | None:
    """Where a dead-letter record came from and why, from the first header set that is present.

    Raises MalformedHeader only for redrive's own headers; other systems' sets are read leniently.
    """
    for reader in _READERS:
        found = reader(headers)
        if found is not None:
            return found
    return None


def header_sets(headers: Sequence[tuple[str, bytes | None]]) -> tuple[str, ...]:
    """Every system whose dead-letter header set the record carries, in order of precedence."""
    found = []
    for reader in _READERS:
        try:
            info = reader(headers)
        except MalformedHeader:
            info = DeadLetterInfo("redrive", None, None, None, None)
        if info is not None:
            found.append(info.system)
    return tuple(found)


def header_text(name: str, value: bytes | None) -> str:
    """A header's value for people: Spring's binary numbers as numbers, other bytes as text,
    null as `(null)`."""
    if value is None:
        return "(null)"
    if name in _SPRING_INTS and len(value) in (4, 8):
        return str(int.from_bytes(value, "big", signed=True))
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("utf-8", errors="backslashreplace")


def spring_fields(origin: Origin, error: ErrorInfo, group: str, *, message_limit: int,
                  trace_limit: int) -> dict[str, bytes | None]:
    """Spring Kafka's dead-letter headers for a record redrive dead-letters, encoded as Spring's
    DeadLetterPublishingRecoverer writes them (a None value removes a stale one)."""
    timestamp = origin.timestamp_ms if origin.timestamp_ms is not None \
        and origin.timestamp_ms >= 0 else None
    cause = error.chain[1][0] if len(error.chain) > 1 else None
    return {
        SPRING_ORIGINAL + "topic": origin.topic.encode(),
        SPRING_ORIGINAL + "partition": struct.pack(">i", origin.partition),
        SPRING_ORIGINAL + "offset": struct.pack(">q", origin.offset),
        SPRING_ORIGINAL + "timestamp": None if timestamp is None else struct.pack(">q", timestamp),
        SPRING_ORIGINAL + "consumer-group": group.encode(),
        SPRING_EXCEPTION + "fqcn": error.type_name.encode(),
        SPRING_EXCEPTION + "cause-fqcn": None if cause is None else cause.encode(),
        SPRING_EXCEPTION + "message": cut(error.message, message_limit).encode(),
        SPRING_EXCEPTION + "stacktrace": cut(error.trace, trace_limit).encode(),
    }
