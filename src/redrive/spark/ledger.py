"""The pipeline's batch ledger: a one-partition Kafka topic with a record per step of each batch.

Spark replays a micro-batch whose end it did not commit (a driver killed mid-batch), and the
foreachBatch body cannot tell a replay from a first run. The ledger tells it:
- `routing` is written, with the end offsets of every destination partition, before a batch's
  failed records are copied. A replay that finds it reads those partitions from there and copies
  only the records whose copy is not already there: each record is copied once.
- `done` is written, with the batch's report, once everything the batch does is confirmed. A
  replay that finds it does nothing again.
The client also reads the reports from here, which is how a pipeline running on Spark Connect
(whose foreachBatch runs in the server's Python process) tells its caller what it did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer

from redrive import headers as h
from redrive import kafka, topics
from redrive.errors import MalformedHeader
from redrive.kafka.ranges import PartitionRange, read_ranges
from redrive.kafka.records import readable_headers

ROUTING, DONE = "routing", "done"
# A copy is known by its origin and the attempt it carries: a replayed batch routes the same
# record to the same attempt, whatever time it runs.
CopyKey = tuple[str, int, int, int]
_READ_IDLE_S = 10.0
# A follower's look at the ledger's end: the driver's run() loop waits on it, and looks again
# a moment later.
LOOK_TIMEOUT_S = 2.0


def ledger_topic(group: str) -> str:
    return topics.pipeline_ledger_name(group)


@dataclass(frozen=True)
class Entry:
    batch: int
    state: str
    # ROUTING: each destination partition's end offset when routing began, "topic:partition".
    marks: Mapping[str, int] = field(default_factory=dict)
    report: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({"batch": self.batch, "state": self.state, "marks": dict(self.marks),
                           "report": dict(self.report)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Entry:
        data = json.loads(raw or b"{}")
        return cls(int(data["batch"]), str(data["state"]), data.get("marks") or {},
                   data.get("report") or {})


def append(producer: Producer, topic: str, entry: Entry) -> None:
    kafka.produce_confirmed(producer, [kafka.OutRecord(topic, entry.encode(), None, [], 0)])


def last(connection: kafka.Connection, topic: str) -> Entry | None:
    """The ledger's newest entry, None when it has none."""
    consumer = kafka.consumer(connection)
    try:
        low, high = kafka.watermarks(consumer, topic, 0)
    finally:
        consumer.close()
    if high <= low:
        return None
    entries = list(read(connection, topic, high - 1, high))
    return entries[-1] if entries else None


def read(connection: kafka.Connection, topic: str, start: int, end: int) -> Iterator[Entry]:
    for message in read_ranges(connection, [PartitionRange(topic, 0, start, end)],
                               idle_s=_READ_IDLE_S):
        yield Entry.decode(message.value())


class Follower:
    """Reads the entries appended to a ledger since it was opened, with one consumer kept for its
    life: the client looks many times a second, and a consumer made per look cost a core's worth
    of CPU beside the query on a 2-core machine (a connection and its threads each time)."""

    def __init__(self, connection: kafka.Connection, topic: str) -> None:
        self.connection = connection
        self.topic = topic
        self._consumer = kafka.consumer(connection)
        self.at = kafka.watermarks(self._consumer, topic, 0)[1]

    def new_entries(self) -> list[Entry]:
        end = kafka.watermarks(self._consumer, self.topic, 0, LOOK_TIMEOUT_S)[1]
        if end <= self.at:
            return []
        entries = list(read(self.connection, self.topic, self.at, end))
        self.at = end
        return entries

    def close(self) -> None:
        self._consumer.close()


def begin_routing(connection: kafka.Connection, producer: Producer, topic: str, batch: int,
                  destinations: Mapping[str, int], resumed: Entry | None,
                  report: Mapping[str, Any],
                  group: str) -> tuple[frozenset[CopyKey], dict[str, int]]:
    """What a batch does before it copies its failed records. Run again (`resumed` is its own
    routing entry), it finds the copies its earlier run wrote since that entry's marks; else it
    takes the end of every destination partition as its marks and appends them in a routing
    entry. Returns the copies already written and the marks the batch's copies go after."""
    if resumed is not None and resumed.state == ROUTING:
        return frozenset(copies_since(connection, resumed.marks, group)), dict(resumed.marks)
    consumer = kafka.consumer(connection)
    try:
        marks = ends(consumer, destinations)
    finally:
        consumer.close()
    append(producer, topic, Entry(batch, ROUTING, marks, report))
    return frozenset(), marks


def ends(consumer: Consumer, partitions: Mapping[str, int]) -> dict[str, int]:
    """The end offset of every partition of these topics, as ledger marks."""
    return {f"{topic}:{p}": kafka.watermarks(consumer, topic, p)[1]
            for topic, count in partitions.items() for p in range(count)}


def copies_since(connection: kafka.Connection, marks: Mapping[str, int],
                 group: str) -> set[CopyKey]:
    """The copies `group` wrote to the destination partitions since the marks were taken
    (the delay tiers hold every group's)."""
    consumer = kafka.consumer(connection)
    try:
        ranges = []
        for mark, start in marks.items():
            topic, _, partition = mark.rpartition(":")
            end = kafka.watermarks(consumer, topic, int(partition))[1]
            if end > start:
                ranges.append(PartitionRange(topic, int(partition), start, end))
    finally:
        consumer.close()
    found: set[CopyKey] = set()
    if not ranges:
        return found
    own = (group.encode(), None)
    for message in read_ranges(connection, ranges, idle_s=_READ_IDLE_S):
        # redrive writes UTF-8 header names only: a record with others is no copy of its own.
        headers, unreadable = readable_headers(message)
        if unreadable is not None:
            continue
        key = copy_key(headers)
        if key is not None and h.last(headers, h.GROUP) in own:
            found.add(key)
    return found


def copy_key(headers: Any) -> CopyKey | None:
    """What identifies a copy: the original record and the attempt it goes to."""
    pairs = h.normalize(headers)
    try:
        topic = h.text_of(pairs, h.ORIGINAL_TOPIC)
        partition = h.last(pairs, h.ORIGINAL_PARTITION)
        offset = h.last(pairs, h.ORIGINAL_OFFSET)
        attempt = h.last(pairs, h.ATTEMPT)
        if topic is None or partition is None or offset is None or attempt is None:
            return None
        return topic, int(partition), int(offset), int(attempt)
    except (ValueError, MalformedHeader):
        return None
