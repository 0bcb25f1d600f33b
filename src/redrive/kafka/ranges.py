"""Reading offsets `[start, end)` of one or several partitions, by assign, with one set of rules.

Every part of redrive that reads a known stretch of a partition reads it here: the Spark source's
gate scan and its confluent-kafka reader, the dead-letter reader, the replay log, the heads of a
group's partitions in `stats`, the store's read-back of a referenced record. (The Spark source's
C readers follow the same rules in C.) The rules:

- A range is read once the consumer's position reaches `end`, not once offset `end - 1` was seen:
  under read_committed the last offsets may be transaction markers or aborted records, which are
  never delivered. An end-of-partition event, or a poll that returns nothing, tells the position.
- No record at or past `end` is handed out.
- A fetch the broker answers "offset out of range" is never jumped past unseen. If the broker
  still holds the offset (some brokers say so for a moment) the read goes on from it; if the
  records are gone (deleted, or past retention) the read fails with `RecordsLost` naming them, or,
  with `skip_lost` (Spark's failOnDataLoss=false), logs them and goes on from the first offset
  left.
- Transient errors are retried by librdkafka; any other error fails the read, naming it.
- A read that makes no progress for `idle_s` fails, naming the offset it is stuck at and the
  client's last error (a broker it cannot reach, say).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from redrive.errors import RedriveError
from redrive.kafka.admin import watermarks
from redrive.kafka.config import Connection, consumer
from redrive.kafka.records import PartitionKey, consumed, readable_headers
from redrive.record import Record

log = logging.getLogger(__name__)

# Settings of a consumer that reads ranges: end-of-partition events tell how far a partition goes,
# and a fetch the broker answers "offset out of range" is reported rather than jumped past
# (auto.offset.reset), so that no record of a range is skipped unseen.
RANGE_READ_DEFAULTS: Mapping[str, Any] = {
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}
# Records per consume(): a few thousand Message objects stay in the CPU caches while a caller
# reads their fields; 2,000 to 10,000 measured alike, 50,000 and more were measurably slower.
CONSUME_BATCH = 5_000
POLL_S = 0.5


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)


class RangeReadFailed(RedriveError):
    """A partition range could not be read to its end."""

    def __init__(self, topic: str, partition: int, start: int, end: int, why: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"reading {topic}[{partition}] offsets [{start}, {end}) failed: {why}")


class RecordsLost(RangeReadFailed):
    """Records of the range are gone from the broker (deleted, or past retention)."""


@dataclass
class Chunk:
    """Records of one range from one poll, in offset order, with their offsets."""

    range: PartitionRange
    messages: list[Message]
    offsets: list[int]


class LastClientError:
    """A consumer's error_cb that keeps the client's last error report (a broker it cannot
    reach, say), for the error of a read that makes no progress."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, error: KafkaError) -> None:
        self.text = error.str()

    def suffix(self) -> str:
        return f"; the client's last error: {self.text}" if self.text else ""


def range_consumer(connection: Connection, overrides: Mapping[str, Any] | None = None,
                   errors: LastClientError | None = None) -> Consumer:
    """An assign-only consumer set up to read ranges (see RANGE_READ_DEFAULTS)."""
    settings: dict[str, Any] = {**(overrides or {}), **RANGE_READ_DEFAULTS}
    if errors is not None:
        settings["error_cb"] = errors
    return consumer(connection, None, settings)


def first_kept(part: PartitionRange, position: int, low: int, skip_lost: bool) -> int:
    """Where to read on when the broker's first offset is `low` and the read is at `position`:
    there, if the broker still holds it; else fail naming the lost offsets, or with `skip_lost`
    log them and go on from the first offset left (at most the range's end)."""
    if position >= low:
        return position
    if not skip_lost:
        raise RecordsLost(part.topic, part.partition, position, part.end,
                          f"offsets {position} to {low - 1} are gone from the broker "
                          "(deleted or past retention)")
    log.warning("%s[%d]: offsets %d to %d are gone from the broker; skipped", part.topic,
                part.partition, position, low - 1)
    return min(low, part.end)


class RangeReader:
    """Reads ranges with `consumer` (see `range_consumer`), which it assigns to them.

    `chunks()` hands out each poll's records per range; a caller that needs no more of a range
    (it found what it looked for) calls `finish` and the reader leaves that range. After the
    iteration, every range was read to its end or finished early.
    """

    def __init__(self, consumer_: Consumer, ranges: Sequence[PartitionRange], *,
                 idle_s: float, skip_lost: bool = False, batch: int = CONSUME_BATCH,
                 errors: LastClientError | None = None) -> None:
        self._consumer = consumer_
        self._open = {r.key: r for r in ranges if r.end > r.start}
        self._positions = {r.key: r.start for r in ranges}
        # With one range, every record consumed is of it: no grouping by partition is needed.
        self._only = next(iter(self._open)) if len(self._open) == 1 else None
        self._idle_s = idle_s
        self._skip_lost = skip_lost
        self._batch = max(1, batch)
        self._errors = errors

    def position(self, key: PartitionKey) -> int:
        """The next offset to read of the range of this partition."""
        return self._positions[key]

    def finish(self, key: PartitionKey) -> None:
        """Read no more of this partition's range."""
        if self._open.pop(key, None) is not None:
            self._consumer.pause([TopicPartition(key[0], key[1])])

    def chunks(self) -> Iterator[Chunk]:
        if not self._open:
            return
        self._assign()
        idle_until = time.monotonic() + self._idle_s
        while self._open:
            # consume() waits until it has num_messages or its timeout passed: never ask for more
            # than the ranges can still hold.
            left = sum(r.end - self._positions[k] for k, r in self._open.items())
            messages = self._consume(min(self._batch, left))
            before = dict(self._positions)
            lost: list[PartitionKey] = []
            if messages and any(map(Message.error, messages)):
                messages = self._events(messages, lost)
            if messages:
                yield from self._take(messages)
            elif not lost:
                self._ask_positions()
            for key in lost:
                self._resume_after_reset(key)
            for key, part in list(self._open.items()):
                if self._positions[key] >= part.end:
                    del self._open[key]
            if self._positions != before:
                idle_until = time.monotonic() + self._idle_s
            elif self._open and time.monotonic() > idle_until:
                key, part = next(iter(self._open.items()))
                raise RangeReadFailed(part.topic, part.partition, part.start, part.end,
                                      f"stuck at offset {self._positions[key]} for "
                                      f"{self._idle_s}s" + self._suffix())

    # --- one poll ------------------------------------------------------------------------------

    def _assign(self) -> None:
        self._consumer.assign([TopicPartition(k[0], k[1], self._positions[k]) for k in self._open])

    def _consume(self, wanted: int) -> list[Message]:
        return self._consumer.consume(num_messages=wanted, timeout=POLL_S)

    def _events(self, messages: list[Message], lost: list[PartitionKey]) -> list[Message]:
        """Account for the events among consumed messages and return the records: an
        end-of-partition event carries the position reached; an offset reset is noted for
        `_resume_after_reset`; transient errors are retried by librdkafka; others are fatal."""
        records: list[Message] = []
        for message in messages:
            err = message.error()
            if err is None:
                records.append(message)
                continue
            key = (str(message.topic()), int(message.partition() or 0))
            if key not in self._open:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                offset = message.offset()
                if offset is not None:
                    self._positions[key] = max(self._positions[key], offset)
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                lost.append(key)
            elif not err.retriable():
                part = self._open[key]
                raise RangeReadFailed(part.topic, part.partition, part.start, part.end,
                                      err.str())
        return records

    def _take(self, records: list[Message]) -> Iterator[Chunk]:
        if self._only is not None:
            runs: Any = [(self._only, records)]
        else:
            runs = groupby(records, key=lambda m: (m.topic(), m.partition()))
        for key, run in runs:
            part = self._open.get(key)
            if part is None:
                continue  # finished early: records fetched before its pause
            messages = run if isinstance(run, list) else list(run)
            # Consumed records of one partition come in offset order.
            offsets = cast("list[int]", list(map(Message.offset, messages)))
            keep = bisect.bisect_left(offsets, part.end)
            if keep < len(messages):
                messages, offsets = messages[:keep], offsets[:keep]
                self._positions[key] = part.end
            if messages:
                self._positions[key] = max(self._positions[key], offsets[-1] + 1)
                yield Chunk(part, messages, offsets)

    def _ask_positions(self) -> None:
        """Nothing came: the consumer's positions tell how far it read past markers and aborted
        records, which it never delivers."""
        wanted = [TopicPartition(k[0], k[1]) for k in self._open]
        for tp in self._consumer.position(wanted):
            key = (str(tp.topic), int(tp.partition))
            if tp.offset >= 0:
                self._positions[key] = max(self._positions[key], int(tp.offset))

    def _resume_after_reset(self, key: PartitionKey) -> None:
        part = self._open[key]
        low, _ = watermarks(self._consumer, part.topic, part.partition)
        self._positions[key] = first_kept(part, self._positions[key], low, self._skip_lost)
        if self._positions[key] >= part.end:
            # Nothing left to read. Assigning it again would restart a fetcher that nothing
            # polls; librdkafka's close() then waited forever (about 1 close in 20 on noida-db).
            self._consumer.incremental_unassign([TopicPartition(part.topic, part.partition)])
        else:
            # The partition's fetcher stopped at the error; assigning it again restarts it there.
            self._assign()

    def _suffix(self) -> str:
        return self._errors.suffix() if self._errors is not None else ""


Narrowing = Callable[[int, int, int], tuple[int, int] | None]


def read_topic(connection: Connection, topic: str, partitions: int, *, idle_s: float,
               narrow: Narrowing | None = None, whole: bool = False) -> Iterator[Message]:
    """The records of `topic` (with `partitions` partitions) from each partition's first offset
    to its end as of the call: records written meanwhile are left for the next read, so a busy
    topic still gives a finite, consistent reading.

    That end is the last stable offset, short of the oldest transaction still open: records
    committed past it are not read. `whole` reads to the high watermark instead, waiting for
    the transactions open below it to end (RangeReadFailed, stuck, after `idle_s`).

    `narrow(partition, low, high)` may shrink a partition's [low, high) to the part worth reading,
    or None to skip the partition.
    """
    errors = LastClientError()
    reader_consumer = range_consumer(connection, errors=errors)
    ends = consumer(connection, None, {"isolation.level": "read_uncommitted"}) if whole \
        else reader_consumer
    try:
        parts: list[PartitionRange] = []
        for partition in range(partitions):
            low, high = watermarks(ends, topic, partition, idle_s)
            part = (low, high) if narrow is None else narrow(partition, low, high)
            if part is not None:
                parts.append(PartitionRange(topic, partition, *part))
        reader = RangeReader(reader_consumer, parts, idle_s=idle_s, errors=errors)
        for chunk in reader.chunks():
            yield from chunk.messages
    finally:
        reader_consumer.close()
        if ends is not reader_consumer:
            ends.close()


def read_ranges(connection: Connection, ranges: Sequence[PartitionRange], *,
                idle_s: float, overrides: Mapping[str, Any] | None = None) -> Iterator[Message]:
    """The records of these ranges, read by a consumer of their own that the end closes
    (`overrides`: its settings beyond the rules', such as another isolation level)."""
    errors = LastClientError()
    reader_consumer = range_consumer(connection, overrides, errors=errors)
    try:
        reader = RangeReader(reader_consumer, ranges, idle_s=idle_s, errors=errors)
        for chunk in reader.chunks():
            yield from chunk.messages
    finally:
        reader_consumer.close()


def heads(connection: Connection, ranges: Sequence[PartitionRange], *,
          idle_s: float) -> dict[PartitionKey, Record]:
    """The first record of each range (markers and aborted records are passed over), for the
    ranges that hold one."""
    errors = LastClientError()
    reader_consumer = range_consumer(connection, errors=errors)
    found: dict[PartitionKey, Record] = {}
    try:
        reader = RangeReader(reader_consumer, ranges, idle_s=idle_s, errors=errors)
        for chunk in reader.chunks():
            head = chunk.messages[0]
            # One whose header names are not UTF-8 is shown without its headers: a due time
            # cannot be read from them.
            found[chunk.range.key] = consumed(head, headers=readable_headers(head)[0])
            reader.finish(chunk.range.key)
    finally:
        reader_consumer.close()
    return found
