"""The data the client layer hands around: records to produce, where they landed, partitions."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message

from redrive.errors import MalformedHeader
from redrive.headers import Headers, normalize
from redrive.record import NO_HISTORY, Delivery, Record, new_record

# A partition as redrive keys its bookkeeping: (topic, partition).
PartitionKey = tuple[str, int]


@dataclass(frozen=True)
class OutRecord:
    """A record to produce. Headers are (name, bytes) pairs, kept in order."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)
    partition: int | None = None
    timestamp_ms: int | None = None


def record_size(record: OutRecord) -> int:
    """The bytes a record carries: key, value, header names and values."""
    return (len(record.key or b"") + len(record.value or b"")
            + sum(len(name) + len(value or b"") for name, value in record.headers))


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


# For a header name that is not UTF-8, confluent-kafka's headers() keeps a half-built list with
# the decode error still pending, and hands that list back, without the error, to every later
# call (iterating it crashes the process). A plain `message.headers()` that the interpreter has
# specialized lets it through even the first time; a call through the C API's checked path, as
# methodcaller's is, raises SystemError. So the first call that fails puts a list naming the
# header in its place (mark_unreadable), which every later reading knows.
_HEADERS = operator.methodcaller("headers")
_UNREADABLE = "redrive-unreadable-header-name"


def mark_unreadable(message: Message, exc: SystemError) -> list[tuple[str, bytes | None]]:
    """Put a list naming the header whose name is not UTF-8 in place of the half-built one that
    `message.headers()` failed with (`exc`); also called by the C loop (_plainrun.c)."""
    cause = exc.__cause__
    name = bytes(cause.object) if isinstance(cause, UnicodeDecodeError) else None
    marked: list[tuple[str, str | bytes | None]] = [(_UNREADABLE, name)]
    message.set_headers(marked)
    return [(_UNREADABLE, name)]


def raw_headers(message: Message) -> list[tuple[str, bytes | None]] | None:
    """A consumed message's headers as confluent-kafka gives them (None for none), or
    MalformedHeader for a header whose name is not UTF-8, naming its bytes."""
    try:
        found: list[tuple[str, bytes | None]] | None = _HEADERS(message)
    except SystemError as exc:
        found = mark_unreadable(message, exc)
    if found and found[0][0] == _UNREADABLE:
        name = found[0][1]
        raise MalformedHeader("(a header)" if name is None else name.decode("utf-8", "replace"),
                              name, "a header name is not UTF-8")
    return found


def headers_or_malformed(message: Message
                         ) -> list[tuple[str, bytes | None]] | MalformedHeader | None:
    """raw_headers, with its MalformedHeader returned rather than raised: for a runtime that
    dead-letters such a record as it would one whose redrive headers are malformed."""
    try:
        return raw_headers(message)
    except MalformedHeader as exc:
        return exc


def message_headers(message: Message) -> Headers:
    """A consumed message's headers as (str, bytes) pairs (confluent-kafka gives None for none);
    MalformedHeader for a header name that is not UTF-8."""
    return normalize(raw_headers(message))


def readable_headers(message: Message) -> tuple[Headers, str | None]:
    """A consumed message's headers, or none and why they cannot be read: a tool listing
    records still shows one whose header names are not UTF-8."""
    try:
        return message_headers(message), None
    except MalformedHeader as exc:
        return [], f"its headers cannot be read ({exc.why})"


def consumed(message: Message, delivery: Delivery = NO_HISTORY, *,
             headers: Headers | None = None) -> Record:
    """A consumed message as the Record handlers and tools see (its headers as they come,
    unless `headers` are given: those read already)."""
    record: Record = new_record(message.topic(), message.partition(), message.offset(),
                                message.timestamp()[1], message.key(), message.value(),
                                message_headers(message) if headers is None else headers,
                                delivery)
    return record
