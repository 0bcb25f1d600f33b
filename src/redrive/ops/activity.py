"""What a group's topics received lately, as the console's overview shows it: records written to
its main topic, its retry topics and its dead-letter topic over the last hour and the last day
(and so per minute), and its dead letters of each window by reason.

Counts come from offsets alone, nothing is read: a window's first offset (that of the first record
whose timestamp falls in it, from offsets_for_times) against the end offset. A transactional
producer's commit markers take offsets too, so on topics written in transactions the counts are
a little high. Reasons need the records themselves: the dead-letter topic's last day is read from
its end, at most its newest READ_CAP records; a window read only in part says so (`complete`), and
its counts are then lower bounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from redrive import kafka
from redrive.clock import now_ms
from redrive.kafka import PartitionKey
from redrive.ops.deadletters import Reader
from redrive.ops.stats import DEAD_LETTER, MAIN, RETRY, TopicStats

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
# Dead letters read at most for their reasons, at every refresh of the overview: 10,000 take
# about a tenth of a second to read.
READ_CAP = 10_000
UNKNOWN_REASON = "unknown"  # a dead letter that names no reason: another system's, or unreadable


@dataclass(frozen=True)
class Written:
    """Records written over the last hour and the last day."""

    hour: int
    day: int

    @property
    def per_minute(self) -> float:
        """Over the last hour: what is happening now, not the day's average."""
        return self.hour / 60


@dataclass(frozen=True)
class Reasons:
    """A window's dead letters by reason, most frequent first."""

    counts: dict[str, int]
    complete: bool  # False: only the window's newest records were read; counts are lower bounds


NO_DEAD_LETTERS = Reasons({}, True)


@dataclass(frozen=True)
class Activity:
    received: Written  # the main topic: every group's input, not only this group's
    retries: Written  # all the group's retry topics
    dead_letters: Written
    reasons_hour: Reasons
    reasons_day: Reasons

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("received", "retries", "dead_letters"):
            out[name]["per_minute"] = round(getattr(self, name).per_minute, 3)
        return out


@dataclass(frozen=True)
class Span:
    """Where one partition's last day and last hour begin, and its end (offsets)."""

    day: int
    hour: int
    end: int


def measure(connection: kafka.Connection, rows: Sequence[TopicStats],
            timeout_s: float) -> Activity:
    """The activity of the topics `stats.collect` found for a group (`rows`)."""
    at = now_ms()
    consumer = kafka.consumer(connection)
    try:
        found = spans(consumer, [(row.topic, p) for row in rows for p in range(row.partitions)],
                      at, timeout_s)
    finally:
        consumer.close()

    role_of = {row.topic: row.role for row in rows}

    def written(role: str) -> Written:
        mine = [span for (topic, _), span in found.items() if role_of[topic] == role]
        return Written(sum(s.end - s.hour for s in mine), sum(s.end - s.day for s in mine))

    dlt = next((row.topic for row in rows if row.role == DEAD_LETTER), None)
    hour, day = NO_DEAD_LETTERS, NO_DEAD_LETTERS
    if dlt is not None:
        hour, day = reasons(connection, dlt, {p: span for (topic, p), span in found.items()
                                              if topic == dlt}, at, timeout_s)
    return Activity(written(MAIN), written(RETRY), written(DEAD_LETTER), hour, day)


def spans(consumer: Consumer, partitions: Sequence[PartitionKey], at_ms: int,
          timeout_s: float) -> dict[PartitionKey, Span]:
    """Where the last day and hour of each partition begin, and where it ends, as of `at_ms`."""
    if not partitions:
        return {}
    day = _offsets_at(consumer, partitions, at_ms - DAY_MS, timeout_s)
    hour = _offsets_at(consumer, partitions, at_ms - HOUR_MS, timeout_s)
    # The ends are asked last, so that no window's start lies past its end.
    ends = {key: kafka.watermarks(consumer, key[0], key[1], timeout_s)[1] for key in partitions}
    return {key: Span(_or_end(day[key], ends[key]), _or_end(hour[key], ends[key]), ends[key])
            for key in partitions}


def _offsets_at(consumer: Consumer, partitions: Sequence[PartitionKey], at_ms: int,
                timeout_s: float) -> dict[PartitionKey, int]:
    """Each partition's first offset whose record's timestamp is `at_ms` or later (-1: none)."""
    found = consumer.offsets_for_times([TopicPartition(t, p, at_ms) for t, p in partitions],
                                       timeout=timeout_s)
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return {(str(tp.topic), int(tp.partition)): int(tp.offset) for tp in found}


def _or_end(offset: int, end: int) -> int:
    return end if offset < 0 else min(offset, end)


def newest(found: Mapping[int, Span], cap: int) -> dict[int, tuple[int, int]]:
    """Each partition's [start, end) of the last day, or, when the partitions hold more than `cap`
    records in it, the newest part of each, the cap shared by the partitions' sizes."""
    total = sum(span.end - span.day for span in found.values())
    window: dict[int, tuple[int, int]] = {}
    for partition, span in found.items():
        size = span.end - span.day
        if size > 0:
            keep = size if total <= cap else max(1, cap * size // total)
            window[partition] = (span.end - keep, span.end)
    return window


def reasons(connection: kafka.Connection, dlt: str, found: Mapping[int, Span], at_ms: int,
            timeout_s: float) -> tuple[Reasons, Reasons]:
    """The dead letters of the last hour and of the last day by reason."""
    window = newest(found, READ_CAP)
    if not window:  # nothing dead-lettered that day: no reader to start
        return NO_DEAD_LETTERS, NO_DEAD_LETTERS
    hour: Counter[str] = Counter()
    day: Counter[str] = Counter()
    for letter in Reader(connection, dlt, timeout_s).ranges(window):
        stamp = letter.record.timestamp_ms
        reason = letter.reason or UNKNOWN_REASON
        if stamp >= at_ms - DAY_MS:
            day[reason] += 1
        if stamp >= at_ms - HOUR_MS:
            hour[reason] += 1
    hour_read = all(start <= found[p].hour for p, (start, _) in window.items())
    day_read = all(start <= found[p].day for p, (start, _) in window.items())
    return (Reasons(dict(hour.most_common()), hour_read),
            Reasons(dict(day.most_common()), day_read))
