"""The header contract: redrive's names, how values are written and read, and validation.

Every value is UTF-8 text (integers in decimal, times in epoch milliseconds) so that kcat and
other plain tools show it as it is. Readers for the dead-letter headers of Spring Kafka,
Kafka Connect and Kafka Streams let redrive inspect and replay what those systems dead-lettered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from redrive.errors import MalformedHeader
from redrive.record import NO_HISTORY, Delivery, ErrorInfo, Origin

Headers = list[tuple[str, bytes]]

PREFIX = "redrive-"
ATTEMPT = "redrive-attempt"
DUE = "redrive-due"
GROUP = "redrive-group"
TARGET = "redrive-target"
ORIGINAL_TOPIC = "redrive-original-topic"
ORIGINAL_PARTITION = "redrive-original-partition"
ORIGINAL_OFFSET = "redrive-original-offset"
ORIGINAL_TIMESTAMP = "redrive-original-timestamp"
FIRST_FAILURE = "redrive-first-failure"
ERROR_TYPE = "redrive-error-type"
ERROR_MESSAGE = "redrive-error-message"
ERROR_TRACE = "redrive-error-trace"
REASON = "redrive-reason"

REASONS = ("exhausted", "not-retryable", "deadline", "malformed")

_INTEGER_HEADERS = (ATTEMPT, DUE, ORIGINAL_PARTITION, ORIGINAL_OFFSET, ORIGINAL_TIMESTAMP,
                    FIRST_FAILURE)


def normalize(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Headers:
    """Headers as confluent-kafka and Spark hand them over, as a list of (str, bytes)."""
    out: Headers = []
    for name, value in headers or ():
        if value is None:
            out.append((name, b""))
        elif isinstance(value, str):
            out.append((name, value.encode()))
        else:
            out.append((name, bytes(value)))
    return out


def last(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    """The last value of a header: Kafka allows repeats and the latest writer wins."""
    for key, value in reversed(headers):
        if key == name:
            return value
    return None


def has_redrive(headers: Sequence[tuple[str, bytes]]) -> bool:
    return any(name.startswith(PREFIX) for name, _ in headers)


def _text(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    return _utf8(name, last(headers, name))


def _utf8(name: str, raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedHeader(name, raw, "not UTF-8 text") from exc


def _integer(headers: Sequence[tuple[str, bytes]], name: str) -> int | None:
    return _whole_number(name, last(headers, name))


_MAX_DIGITS = 19  # Kafka's offsets and timestamps are 64-bit


def _whole_number(name: str, raw: bytes | None) -> int | None:
    if raw is None:
        return None
    if raw.isdigit() and len(raw) <= _MAX_DIGITS:  # ASCII digits: the form redrive writes
        return int(raw)
    stripped = (_utf8(name, raw) or "").strip()
    if not stripped.isascii() or not stripped.lstrip("-").isdigit():
        raise MalformedHeader(name, raw, "expected a decimal integer")
    if len(stripped.lstrip("-")) > _MAX_DIGITS:
        # Past a 64-bit integer; Python's int() would also refuse thousands of digits.
        raise MalformedHeader(name, raw, f"more than {_MAX_DIGITS} digits")
    value = int(stripped)
    if value < 0:
        raise MalformedHeader(name, raw, "must be >= 0")
    return value


def read_due(headers: Sequence[tuple[str, bytes]]) -> int | None:
    """The record's due time in epoch ms, None when it has none; raises MalformedHeader."""
    return _integer(headers, DUE)


def read_delivery(headers: Sequence[tuple[str, bytes]]) -> Delivery:
    """Decode and validate redrive's headers into a Delivery; raises MalformedHeader."""
    # One pass, the last value of each name winning: this runs for every retried record.
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name.startswith(PREFIX):
            found[name] = value
    if not found:
        return NO_HISTORY
    get = found.get
    attempt, due, partition, offset, timestamp, first_failure = [
        _whole_number(name, get(name)) for name in _INTEGER_HEADERS]
    topic = _utf8(ORIGINAL_TOPIC, get(ORIGINAL_TOPIC))
    original: Origin | None = None
    if topic is not None or partition is not None or offset is not None:
        original = _origin_of(topic, partition, offset, timestamp)
    group = _utf8(GROUP, get(GROUP))
    if group == "":
        raise MalformedHeader(GROUP, b"", "empty group")
    target = _utf8(TARGET, get(TARGET))
    if target == "":
        raise MalformedHeader(TARGET, b"", "empty topic name")
    return Delivery(attempt or 0, first_failure, group, original, due, target)


def _origin_of(topic: str | None, partition: int | None, offset: int | None,
               timestamp: int | None) -> Origin:
    if topic and partition is not None and offset is not None:
        return Origin(topic, partition, offset, timestamp)
    parts = {ORIGINAL_TOPIC: topic, ORIGINAL_PARTITION: partition, ORIGINAL_OFFSET: offset}
    missing = [name for name, value in parts.items() if value is None]
    if missing:
        present = ", ".join(name for name, value in parts.items() if value is not None)
        raise MalformedHeader(missing[0], None, f"missing while {present} is present")
    if not topic:
        raise MalformedHeader(ORIGINAL_TOPIC, b"", "empty topic name")
    assert partition is not None and offset is not None
    return Origin(topic, partition, offset, timestamp)


def validate(headers: Sequence[tuple[str, bytes]]) -> None:
    """Raise MalformedHeader if any redrive header present cannot be parsed."""
    read_delivery(headers)
    reason = _text(headers, REASON)
    if reason is not None and reason not in REASONS:
        raise MalformedHeader(REASON, last(headers, REASON), f"expected one of {REASONS}")


def cut(text: str, limit: int) -> str:
    """Trim text to at most `limit` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def replace(headers: Sequence[tuple[str, bytes]],
            updates: Mapping[str, str | int | None]) -> Headers:
    """Drop every redrive header named in `updates`, then append the new values.

    Other headers, redrive's own not named, and any bytes they carry, are kept as they were and in
    their order; a None value removes the header.
    """
    kept: Headers = [(name, value) for name, value in headers if name not in updates]
    for name, value in updates.items():
        if value is not None:
            kept.append((name, (value if type(value) is str else str(value)).encode()))
    return kept


def error_fields(error: ErrorInfo, *, message_limit: int, trace_limit: int) -> dict[str, str]:
    return {
        ERROR_TYPE: error.type_name,
        ERROR_MESSAGE: cut(error.message, message_limit),
        ERROR_TRACE: cut(error.trace, trace_limit),
    }


def origin_fields(origin: Origin) -> dict[str, str | int | None]:
    # Kafka reports a missing timestamp as -1: leave the header out rather than write it.
    timestamp = origin.timestamp_ms if origin.timestamp_ms is not None \
        and origin.timestamp_ms >= 0 else None
    return {
        ORIGINAL_TOPIC: origin.topic,
        ORIGINAL_PARTITION: origin.partition,
        ORIGINAL_OFFSET: origin.offset,
        ORIGINAL_TIMESTAMP: timestamp,
    }


# --- dead-letter records written by other systems -------------------------------------------


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
        "redrive", delivery.original, _text(headers, ERROR_TYPE), _text(headers, ERROR_MESSAGE),
        _text(headers, ERROR_TRACE), delivery.attempt, delivery.group, _text(headers, REASON))


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
