"""The data the client layer hands around: records to produce, where they landed, partitions."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message

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


# For a header name that is not UTF-8, confluent-kafka's headers() returns a half-built list with
# the decode error still pending. A plain `message.headers()` that the interpreter has specialized
# lets that list through (iterating it crashes the process); a call through the C API's checked
# path, as methodcaller's is, raises SystemError every time.
_HEADERS = operator.methodcaller("headers")


def message_headers(message: Message) -> Headers:
    """A consumed message's headers as (str, bytes) pairs (confluent-kafka gives None for none);
    SystemError for a header name that is not UTF-8."""
    return normalize(_HEADERS(message))


def readable_headers(message: Message) -> tuple[Headers, str | None]:
    """A consumed message's headers, or none and why they cannot be read.

    A tool listing records still shows one whose header names are not UTF-8; its message's
    headers must not be asked for again (see _HEADERS)."""
    try:
        return message_headers(message), None
    except SystemError as exc:
        return [], f"its headers cannot be read (a header name is not UTF-8): " \
                   f"{exc.__cause__ or exc}"


def consumed(message: Message, delivery: Delivery = NO_HISTORY, *,
             headers: Headers | None = None) -> Record:
    """A consumed message as the Record handlers and tools see (its headers as they come,
    unless `headers` are given: those read already)."""
    record: Record = new_record(message.topic(), message.partition(), message.offset(),
                                message.timestamp()[1], message.key(), message.value(),
                                message_headers(message) if headers is None else headers,
                                delivery)
    return record
