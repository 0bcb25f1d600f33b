"""Reading dead-letter topics: decode each record's story, and select records by what they say.

A dead-letter topic may hold records written by redrive, Spring Kafka, Kafka Connect, Kafka
Streams, a share group (KIP-1191) or Karafka (`redrive.dead_letter_headers` tells them apart). A
record whose redrive headers cannot be parsed is still listed, flagged with what is wrong, so that
one bad record never hides the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from redrive import headers as h
from redrive import kafka, topics
from redrive.clock import now_ms
from redrive.dead_letter_headers import (
    DeadLetterInfo,
    header_sets,
    header_text,
    read_dead_letter,
)
from redrive.errors import InvalidArgument, MalformedHeader, UnknownTopic
from redrive.kafka.ranges import read_topic
from redrive.kafka.records import consumed, readable_headers
from redrive.policy import to_ms
from redrive.record import Record

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DeadLetterRecord:
    """One record of a dead-letter topic, with its decoded story (or why it has none)."""

    record: Record
    info: DeadLetterInfo | None
    problem: str | None = None  # set when the record's headers cannot be read or parsed

    @classmethod
    def of(cls, record: Record) -> DeadLetterRecord:
        try:
            return cls(record, read_dead_letter(record.headers))
        except MalformedHeader as exc:
            return cls(record, None, str(exc))

    @classmethod
    def read(cls, message: Message) -> DeadLetterRecord:
        """A consumed message's record; one whose headers cannot be read is kept without them,
        flagged (so a replay leaves it alone rather than publish it stripped)."""
        headers, problem = readable_headers(message)
        record = consumed(message, headers=headers)
        return cls.of(record) if problem is None else cls(record, None, problem)

    @property
    def coordinates(self) -> str:
        return f"{self.record.partition}:{self.record.offset}"

    @property
    def system(self) -> str | None:
        return self.info.system if self.info else None

    @property
    def reason(self) -> str | None:
        return self.info.reason if self.info else None

    @property
    def error_type(self) -> str | None:
        return self.info.error_type if self.info else None

    @property
    def error_message(self) -> str | None:
        return self.info.error_message if self.info else None

    def age_ms(self, at_ms: int) -> int:
        return max(0, at_ms - self.record.timestamp_ms)

    def to_json(self, at_ms: int, *, full: bool = False) -> dict[str, Any]:
        record, info = self.record, self.info
        origin = info.original if info else None
        out: dict[str, Any] = {
            "topic": record.topic, "partition": record.partition, "offset": record.offset,
            "timestamp_ms": record.timestamp_ms, "age_ms": self.age_ms(at_ms),
            "key": text(record.key), "system": self.system, "reason": self.reason,
            "error_type": self.error_type, "error_message": self.error_message,
            "attempts": info.attempts if info else None, "group": info.group if info else None,
            "original": None if origin is None else {
                "topic": origin.topic, "partition": origin.partition, "offset": origin.offset,
                "timestamp_ms": origin.timestamp_ms},
            "problem": self.problem,
        }
        if full:
            out["value"] = text(record.value)
            out["headers"] = [[name, None if value is None else header_text(name, value)]
                              for name, value in record.headers]
            out["header_sets"] = list(header_sets(record.headers))
            out["error_trace"] = info.error_trace if info else None
        return out


def text(raw: bytes | None) -> str | None:
    """Bytes as text for people and JSON; bytes that are not UTF-8 are shown escaped."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="backslashreplace")


# --- filters ----------------------------------------------------------------------------------


_EARLIEST_MS = 100_000_000_000  # 1973-03-03


def parse_time(value: str, field_name: str, at_ms: int) -> int:
    """Epoch ms from a duration back from `at_ms` ("2h") or an ISO time (UTC unless it says)."""
    stripped = value.strip()
    try:
        back_ms = to_ms(stripped, field_name)
    except InvalidArgument:
        pass
    else:
        if at_ms - back_ms < _EARLIEST_MS:
            # 1764236400 (epoch seconds) or 1764236400000 (ms) read as seconds back from now:
            # everything since 1970 would be selected without a word.
            raise InvalidArgument(field_name, value, "a bare number is seconds back from now, "
                                  "and this reaches before 1973: for a moment give an ISO time "
                                  "such as 2026-11-22T10:00:00Z")
        return at_ms - back_ms
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError as exc:
        raise InvalidArgument(field_name, value, "expected a duration back from now (30m, 2h, "
                              "1d) or an ISO time such as 2026-11-22T10:00:00Z") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_header_match(value: str) -> tuple[str, str]:
    name, sep, expected = value.partition("=")
    if not sep or not name:
        raise InvalidArgument("header", value, "expected NAME=VALUE")
    return name, expected


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead-letter records to select; every given condition must hold (empty: all).

    An error type matches by its full name or its last dotted part, so `TimeoutError` selects
    `java.util.concurrent.TimeoutError` as well as Python's builtin; it matches a record's error
    or, where its writer names one apart (Spring), that error's cause.
    """

    reasons: frozenset[str] = frozenset()
    error_types: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    keys: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    partitions: frozenset[int] = frozenset()
    coordinates: frozenset[tuple[int, int]] = frozenset()  # (partition, offset)

    def matches(self, letter: DeadLetterRecord) -> bool:
        record = letter.record
        if self.partitions and record.partition not in self.partitions:
            return False
        if self.coordinates and (record.partition, record.offset) not in self.coordinates:
            return False
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.error_types and not (
                _type_matches(letter.error_type, self.error_types)
                or _type_matches(letter.info.cause_type if letter.info else None,
                                 self.error_types)):
            return False
        if self.since_ms is not None and record.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and record.timestamp_ms > self.until_ms:
            return False
        if self.keys and text(record.key) not in self.keys:
            return False
        # A null value is not the empty one `--header NAME=` asks for.
        return all(text(h.last(record.headers, name, null=None)) == expected
                   for name, expected in self.headers)

    def offsets(self, partition: int, low: int, high: int) -> tuple[int, int] | None:
        """The part [start, end) of a partition holding `low`..`high` that can match, or None.

        Named records are read from their own offsets, not from the partition's start.
        """
        if self.partitions and partition not in self.partitions:
            return None
        if self.coordinates:
            wanted = [offset for p, offset in self.coordinates if p == partition]
            if not wanted:
                return None
            low, high = max(low, min(wanted)), min(high, max(wanted) + 1)
        return (low, high) if high > low else None


def _type_matches(error_type: str | None, wanted: frozenset[str]) -> bool:
    if error_type is None:
        return False
    return error_type in wanted or error_type.rsplit(".", 1)[-1] in wanted


def make_filter(*, reasons: Sequence[str] = (), error_types: Sequence[str] = (),
                since: str | None = None, until: str | None = None, keys: Sequence[str] = (),
                headers: Sequence[str] = (), partitions: Sequence[int] = (),
                at_ms: int | None = None) -> DeadLetterFilter:
    """A DeadLetterFilter from the values a user types (durations, ISO times, NAME=VALUE)."""
    at = now_ms() if at_ms is None else at_ms
    since_ms = parse_time(since, "since", at) if since is not None else None
    until_ms = parse_time(until, "until", at) if until is not None else None
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise InvalidArgument("since", since, f"is later than until={until!r}")
    for partition in partitions:
        if partition < 0:
            raise InvalidArgument("partition", partition, "must be >= 0")
    for reason in reasons:
        # A mistyped reason would select nothing and read as "no such dead letters".
        if reason not in h.REASONS:
            raise InvalidArgument("reason", reason, f"expected one of {', '.join(h.REASONS)}")
    return DeadLetterFilter(frozenset(reasons), frozenset(error_types), since_ms, until_ms,
                  frozenset(keys), tuple(parse_header_match(m) for m in headers),
                  frozenset(partitions))


def parse_coordinates(value: str) -> tuple[int, int]:
    """PARTITION:OFFSET, as `dlt ls` prints it."""
    partition, sep, offset = value.partition(":")
    if not sep or not (partition + offset).isascii() or not partition.isdigit() \
            or not offset.isdigit():
        raise InvalidArgument("record", value, "expected PARTITION:OFFSET such as 0:42")
    return int(partition), int(offset)


# --- reading ----------------------------------------------------------------------------------


def dead_letter_topic(topic: str, group: str) -> str:
    return topics.dead_letter_name(topics.check_name("topic", topic),
                                   topics.check_name("group", group))


@dataclass
class Reader:
    """Reads a dead-letter topic from its start to the end offsets seen when reading began.

    Records written while reading are left for the next look, so that a busy topic still
    gives a finite, consistent listing.
    """

    connection: kafka.Connection
    topic: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    _partitions: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        counts = kafka.topic_partitions(kafka.admin(self.connection), self.timeout_s)
        if self.topic not in counts:
            raise UnknownTopic(self.topic)
        self._partitions = counts[self.topic]

    def records(self, selection: DeadLetterFilter | None = None) -> Iterator[DeadLetterRecord]:
        selection = selection or DeadLetterFilter()
        for partition in sorted(selection.partitions):
            self.check_partition(partition, "partition", partition)
        for message in read_topic(self.connection, self.topic, self._partitions,
                                  idle_s=self.timeout_s, narrow=selection.offsets):
            letter = DeadLetterRecord.read(message)
            if selection.matches(letter):
                yield letter

    def marks(self) -> dict[int, tuple[int, int]]:
        """Each partition's [low, high) offsets now."""
        consumer = kafka.consumer(self.connection)
        try:
            return {partition: kafka.watermarks(consumer, self.topic, partition, self.timeout_s)
                    for partition in range(self._partitions)}
        finally:
            consumer.close()

    def ranges(self, wanted: Mapping[int, tuple[int, int]],
               selection: DeadLetterFilter | None = None) -> Iterator[DeadLetterRecord]:
        """The records of [start, end) of each partition in `wanted` that `selection` matches."""
        selection = selection or DeadLetterFilter()

        def narrow(partition: int, low: int, high: int) -> tuple[int, int] | None:
            if partition not in wanted:
                return None
            start, end = max(low, wanted[partition][0]), min(high, wanted[partition][1])
            return (start, end) if end > start else None

        for message in read_topic(self.connection, self.topic, self._partitions,
                                  idle_s=self.timeout_s, narrow=narrow):
            letter = DeadLetterRecord.read(message)
            if selection.matches(letter):
                yield letter

    def check_partition(self, partition: int, field: str, value: object) -> None:
        """Refuse a partition the topic does not have, naming the field it was given as."""
        if not 0 <= partition < self._partitions:
            raise InvalidArgument(field, value,
                                  f"{self.topic} has partitions 0..{self._partitions - 1}")

    def named(self, selection: DeadLetterFilter, field: str) -> list[DeadLetterRecord]:
        """The records `selection` names by their coordinates that it matches, read once.
        Refuses a named record the topic cannot hold (a replay of it would select nothing and
        read as done), naming the field it was given as."""
        for partition in sorted(selection.partitions):
            self.check_partition(partition, "partition", partition)
        marks = self.marks()
        named = sorted(selection.coordinates)
        for partition, offset in named:
            self.check_partition(partition, field, f"{partition}:{offset}")
            low, high = marks[partition]
            if not low <= offset < high:
                raise InvalidArgument(field, f"{partition}:{offset}",
                                      f"{self.topic}[{partition}] holds no record there "
                                      f"(offsets {low}..{high - 1})" if high > low else
                                      f"{self.topic}[{partition}] holds no record")
        letters = list(self.records(DeadLetterFilter(partitions=frozenset(p for p, _ in named),
                                                     coordinates=selection.coordinates)))
        # Within the offsets, a transaction's marker or aborted record is no record either.
        found = {(letter.record.partition, letter.record.offset) for letter in letters}
        for partition, offset in named:
            if (partition, offset) not in found:
                raise InvalidArgument(field, f"{partition}:{offset}",
                                      f"{self.topic}[{partition}] holds no record there (a "
                                      "transaction's marker or aborted record)")
        return [letter for letter in letters if selection.matches(letter)]

    def one(self, partition: int, offset: int) -> DeadLetterRecord:
        """The record at partition:offset; raises InvalidArgument if there is none."""
        self.check_partition(partition, "record", f"{partition}:{offset}")
        found = list(self.records(DeadLetterFilter(partitions=frozenset({partition}),
                                                   coordinates=frozenset({(partition, offset)}))))
        if not found:
            raise InvalidArgument("record", f"{partition}:{offset}",
                                  f"{self.topic} holds no record there")
        return found[0]
