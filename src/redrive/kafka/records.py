"""The data the client layer hands around: records to produce, where they landed, partitions."""

from __future__ import annotations

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
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)
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


def message_headers(message: Message) -> Headers:
    """A consumed message's headers as (str, bytes) pairs (confluent-kafka gives None for none)."""
    return normalize(message.headers())


def consumed(message: Message, delivery: Delivery = NO_HISTORY) -> Record:
    """A consumed message as the Record handlers and tools see (its headers as they come)."""
    record: Record = new_record(message.topic(), message.partition(), message.offset(),
                                message.timestamp()[1], message.key(), message.value(),
                                normalize(message.headers()), delivery)
    return record
