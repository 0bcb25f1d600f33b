"""Reading dead-letter topics: decode each record's story, filter, and show it.

A dead-letter topic may hold records written by redrive, Spring Kafka, Kafka Connect or Kafka
Streams (`headers.read_dead_letter` tells them apart). A record whose redrive headers cannot be
parsed is still listed, flagged with what is wrong, so that one bad record never hides the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import TopicPartition

from redrive import headers as h
from redrive import kafka, topics
from redrive.errors import InvalidArgument, MalformedHeader, UnknownTopic
from redrive.headers import DeadLetterInfo
from redrive.policy import to_ms

DEFAULT_TIMEOUT_S = 10.0
_POLL_S = 0.2


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class DeadLetterRecord:
    """One record of a dead-letter topic, with its decoded story (or why it has none)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    info: DeadLetterInfo | None
    problem: str | None = None  # set when the record's redrive headers cannot be parsed

    @classmethod
    def decode(cls, topic: str, partition: int, offset: int, timestamp_ms: int,
               key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes]]) -> DeadLetterRecord:
        try:
            info = h.read_dead_letter(headers)
        except MalformedHeader as exc:
            return cls(topic, partition, offset, timestamp_ms, key, value, headers, None,
                       str(exc))
        return cls(topic, partition, offset, timestamp_ms, key, value, headers, info)

    @property
    def coordinates(self) -> str:
        return f"{self.partition}:{self.offset}"

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
        return max(0, at_ms - self.timestamp_ms)

    def to_json(self, at_ms: int, *, full: bool = False) -> dict[str, Any]:
        info = self.info
        origin = info.original if info else None
        out: dict[str, Any] = {
            "topic": self.topic, "partition": self.partition, "offset": self.offset,
            "timestamp_ms": self.timestamp_ms, "age_ms": self.age_ms(at_ms),
            "key": text(self.key), "system": self.system, "reason": self.reason,
            "error_type": self.error_type, "error_message": self.error_message,
            "attempts": info.attempts if info else None, "group": info.group if info else None,
            "original": None if origin is None else {
                "topic": origin.topic, "partition": origin.partition, "offset": origin.offset,
                "timestamp_ms": origin.timestamp_ms},
            "problem": self.problem,
        }
        if full:
            out["value"] = text(self.value)
            out["headers"] = [[name, text(value)] for name, value in self.headers]
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


def parse_time(value: str, field_name: str, at_ms: int) -> int:
    """Epoch ms from a duration back from `at_ms` ("2h") or an ISO time (UTC unless it says)."""
    stripped = value.strip()
    try:
        return at_ms - to_ms(stripped, field_name)
    except InvalidArgument:
        pass
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
class Filter:
    """Which dead-letter records to select; every given condition must hold (empty: all).

    An error type matches by its full name or its last dotted part, so `TimeoutError` selects
    `java.util.concurrent.TimeoutError` as well as Python's builtin.
    """

    reasons: frozenset[str] = frozenset()
    error_types: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    keys: frozenset[str] = frozenset()
    headers: tuple[tuple[str, str], ...] = ()
    partitions: frozenset[int] = frozenset()
    coordinates: frozenset[tuple[int, int]] = frozenset()  # (partition, offset)

    def matches(self, record: DeadLetterRecord) -> bool:
        if self.partitions and record.partition not in self.partitions:
            return False
        if self.coordinates and (record.partition, record.offset) not in self.coordinates:
            return False
        if self.reasons and record.reason not in self.reasons:
            return False
        if self.error_types and not _type_matches(record.error_type, self.error_types):
            return False
        if self.since_ms is not None and record.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and record.timestamp_ms > self.until_ms:
            return False
        if self.keys and text(record.key) not in self.keys:
            return False
        return all(text(h.last(record.headers, name)) == expected
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
                at_ms: int | None = None) -> Filter:
    """A Filter from the values a user types (durations, ISO times, NAME=VALUE)."""
    at = now_ms() if at_ms is None else at_ms
    since_ms = parse_time(since, "since", at) if since is not None else None
    until_ms = parse_time(until, "until", at) if until is not None else None
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise InvalidArgument("since", since, f"is later than until={until!r}")
    for partition in partitions:
        if partition < 0:
            raise InvalidArgument("partition", partition, "must be >= 0")
    return Filter(frozenset(reasons), frozenset(error_types), since_ms, until_ms,
                  frozenset(keys), tuple(parse_header_match(m) for m in headers),
                  frozenset(partitions))


def parse_coordinates(value: str) -> tuple[int, int]:
    """PARTITION:OFFSET, as `dlt ls` prints it."""
    partition, sep, offset = value.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
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

    def records(self, selection: Filter | None = None) -> Iterator[DeadLetterRecord]:
        selection = selection or Filter()
        consumer = kafka.consumer(self.connection)
        try:
            ends: dict[int, int] = {}
            starts: list[TopicPartition] = []
            for partition in range(self._partitions):
                if selection.partitions and partition not in selection.partitions:
                    continue
                low, high = kafka.watermarks(consumer, self.topic, partition, self.timeout_s)
                part = selection.offsets(partition, low, high)
                if part is not None:
                    ends[partition] = part[1]
                    starts.append(TopicPartition(self.topic, partition, part[0]))
            if not ends:
                return
            consumer.assign(starts)
            yield from self._until_ends(consumer, ends, selection)
        finally:
            consumer.close()

    def _until_ends(self, consumer: Any, ends: dict[int, int],
                    selection: Filter) -> Iterator[DeadLetterRecord]:
        remaining = dict(ends)
        idle_deadline = time.monotonic() + self.timeout_s
        while remaining:
            messages = consumer.consume(500, _POLL_S)
            if messages:
                idle_deadline = time.monotonic() + self.timeout_s
            for message in messages:
                if message.error() is not None:
                    continue
                partition = int(message.partition() or 0)
                offset = int(message.offset() or 0)
                end = remaining.get(partition)
                if end is None or offset >= end:
                    continue
                record = DeadLetterRecord.decode(
                    self.topic, partition, offset, int(message.timestamp()[1]), message.key(),
                    message.value(), kafka.message_headers(message))
                if selection.matches(record):
                    yield record
                if offset + 1 >= end:
                    del remaining[partition]
            self._drop_finished(consumer, remaining)
            if remaining and time.monotonic() > idle_deadline:
                # Aborted transactions and compaction leave offsets that no record fills.
                return

    def _drop_finished(self, consumer: Any, remaining: dict[int, int]) -> None:
        for partition in list(remaining):
            position = consumer.position([TopicPartition(self.topic, partition)])[0].offset
            if position >= remaining[partition]:
                del remaining[partition]

    def one(self, partition: int, offset: int) -> DeadLetterRecord:
        """The record at partition:offset; raises InvalidArgument if there is none."""
        if not 0 <= partition < self._partitions:
            raise InvalidArgument("record", f"{partition}:{offset}",
                                  f"{self.topic} has partitions 0..{self._partitions - 1}")
        found = list(self.records(Filter(partitions=frozenset({partition}),
                                         coordinates=frozenset({(partition, offset)}))))
        if not found:
            raise InvalidArgument("record", f"{partition}:{offset}",
                                  f"{self.topic} holds no record there")
        return found[0]


def summary_row(record: DeadLetterRecord, at_ms: int,
                message_width: int = 60) -> list[object]:
    """One line of `dlt ls`: where, key, age, why, and where the record first came from."""
    info = record.info
    origin = info.original if info else None
    message = record.problem if record.problem else (record.error_message or "")
    message = " ".join(message.split())
    if len(message) > message_width:
        message = message[:message_width - 1] + "…"
    return [
        record.coordinates,
        text(record.key) or "",
        format_age(record.age_ms(at_ms)),
        "UNREADABLE" if record.problem else (record.reason or "-"),
        record.system or "-",
        record.error_type or "",
        message,
        "" if info is None or info.attempts is None else info.attempts,
        "" if origin is None else f"{origin.topic}[{origin.partition}]@{origin.offset}",
    ]


SUMMARY_COLUMNS = ["record", "key", "age", "reason", "system", "error", "message", "attempts",
                   "original"]


def format_age(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s" if seconds else f"{ms}ms"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def detail(record: DeadLetterRecord, at_ms: int) -> str:
    """Everything about one record: its story, its payload and every header, as text."""
    info = record.info
    lines = [
        f"record:     {record.topic} {record.coordinates}",
        f"timestamp:  {_iso(record.timestamp_ms)} ({format_age(record.age_ms(at_ms))} ago)",
        f"key:        {text(record.key)}",
    ]
    if record.problem:
        lines.append(f"UNREADABLE: {record.problem}")
    if info is not None:
        origin = info.original
        lines += [
            f"written by: {info.system}",
            f"reason:     {info.reason or '-'}",
            f"group:      {info.group or '-'}",
            f"attempts:   {'-' if info.attempts is None else info.attempts}",
            "original:   " + ("-" if origin is None else
                              f"{origin.topic} {origin.partition}:{origin.offset}"
                              + ("" if origin.timestamp_ms is None
                                 else f" at {_iso(origin.timestamp_ms)}")),
            f"error:      {info.error_type or '-'}",
            f"message:    {info.error_message or '-'}",
        ]
    lines.append(f"value:      {text(record.value)}")
    lines.append("headers:")
    lines += [f"  {name}: {_header_text(name, value)}" for name, value in record.headers]
    trace = info.error_trace if info else None
    if trace:
        lines.append("trace:")
        lines += ["  " + line for line in trace.rstrip().splitlines()]
    return "\n".join(lines)


def _header_text(name: str, value: bytes) -> str:
    shown = text(value) or ""
    if "stacktrace" in name or name.endswith("trace"):
        first = shown.splitlines()[0] if shown else ""
        return f"{first} … (trace below)" if "\n" in shown else shown
    return shown


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")

