"""Where a group's records wait: the main topic, each retry topic and the dead-letter topic.

For each topic: records waiting (end offset minus the group's committed offset, or minus the
start offset where the group has committed nothing; for the dead-letter topic, everything in
it; counted from offsets, so a transactional producer's commit markers among the records count
too, but a partition whose range holds markers only counts none), the lag behind committed
offsets, the oldest waiting record's age and due time (read at
the committed offset of each partition, where the group will resume), when the topic's retention
deletes that record, and how many records were appended and consumed over a window (two samples
of the offsets).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer

from redrive import gate, kafka, topics
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.kafka.admin import PartitionOffsets, partition_offsets
from redrive.kafka.ranges import PartitionRange
from redrive.kafka.ranges import heads as read_heads
from redrive.policy import RetryPolicy, to_ms

MAIN = "main"
RETRY = "retry"
DEAD_LETTER = "dead-letter"
DEFAULT_TIMEOUT_S = 10.0
_HEAD_WAIT_S = 3.0



def discover_retry_topics(existing: Iterable[str], topic: str, group: str) -> list[str]:
    """The retry topics of (topic, group) on the cluster, by redrive's naming, shortest first.

    Suffixes are delays (`5s`, per delay) or attempt numbers (`2`, per attempt); either way the
    order by value is the order records move through them for the usual rising schedules.
    """
    prefix = topics.retry_topic_name(topic, group, "")
    found = [name for name in existing if topics.retried_topic(name, group) == topic]

    def order(name: str) -> tuple[int, str]:
        suffix = name[len(prefix):]
        try:
            return (int(suffix), name) if suffix.isdigit() else (to_ms(suffix), name)
        except InvalidArgument:
            return (2**62, name)

    return sorted(found, key=order)


@dataclass(frozen=True)
class Roles:
    """The topics of one (topic, group) and the part each plays."""

    main: str
    retry: tuple[str, ...]
    dead_letter: str | None

    def items(self) -> list[tuple[str, str]]:
        dlt = [(self.dead_letter, DEAD_LETTER)] if self.dead_letter else []
        return [(self.main, MAIN), *[(name, RETRY) for name in self.retry], *dlt]


def roles(existing: Mapping[str, int], topic: str, group: str,
          policy: RetryPolicy | None = None) -> Roles:
    """The group's topics: from the policy's plan if given, else as found on the cluster."""
    if topic not in existing:
        raise UnknownTopic(topic)
    if policy is not None:
        plan = topics.plan(policy, topic, group)
        for name in plan.created_topics:
            if name not in existing:
                raise UnknownTopic(name)
        return Roles(topic, tuple(plan.retry_topic_names), plan.dead_letter)
    dlt = topics.dead_letter_name(topic, group)
    return Roles(topic, tuple(discover_retry_topics(existing, topic, group)),
                 dlt if dlt in existing else None)


@dataclass(frozen=True)
class Snapshot:
    at_ms: int
    offsets: dict[str, dict[int, PartitionOffsets]]  # topic -> partition -> offsets


@dataclass(frozen=True)
class Head:
    """The first record the group has yet to finish on one partition."""

    timestamp_ms: int
    due_ms: int | None


@dataclass(frozen=True)
class TopicStats:
    topic: str
    role: str
    partitions: int
    waiting: int
    lag: int | None  # end minus committed, over partitions with a commit; None: no commits
    oldest_ms: int | None  # timestamp of the oldest waiting record
    next_due_ms: int | None  # earliest due time among the partitions' waiting heads
    appended: int  # records appended during the window
    consumed: int | None  # offsets the group committed past during the window
    window_s: float
    # How long the topic keeps a record where it deletes them by time (retention.ms); None: for
    # ever, by compaction, or not told.
    retention_ms: int | None = None

    @property
    def oldest_deleted_ms(self) -> int | None:
        """When retention deletes the oldest waiting record, and those behind it go unhandled."""
        if self.oldest_ms is None or self.retention_ms is None:
            return None
        return self.oldest_ms + self.retention_ms

    def rate(self, count: int | None) -> float | None:
        if count is None or self.window_s <= 0:
            return None
        return count / self.window_s


def snapshot(consumer: Consumer, layout: Roles, counts: Mapping[str, int],
             timeout_s: float = DEFAULT_TIMEOUT_S) -> Snapshot:
    at = now_ms()
    found = partition_offsets(consumer, [(name, p) for name, _ in layout.items()
                                         for p in range(counts[name])], timeout_s)
    offsets: dict[str, dict[int, PartitionOffsets]] = {}
    for name, role in layout.items():
        per = {p: found[(name, p)] for p in range(counts[name])}
        if role == DEAD_LETTER:
            # The dead-letter topic is not consumed by the group: all of it is waiting.
            per = {p: dataclasses.replace(o, committed=None) for p, o in per.items()}
        offsets[name] = per
    return Snapshot(at, offsets)


def heads(connection: kafka.Connection, shot: Snapshot,
          wait_s: float = _HEAD_WAIT_S) -> dict[tuple[str, int], Head]:
    """The record at each partition's resume position, where records are waiting."""
    waiting = [PartitionRange(name, partition, o.resume, o.high)
               for name, per in shot.offsets.items() for partition, o in per.items()]
    return {tp: Head(record.timestamp_ms, gate.due_of(record.headers))
            for tp, record in read_heads(connection, waiting, idle_s=wait_s).items()}


def summarize(layout: Roles, before: Snapshot, after: Snapshot,
              found: Mapping[tuple[str, int], Head],
              retentions: Mapping[str, int] | None = None) -> list[TopicStats]:
    window_s = max(0.0, (after.at_ms - before.at_ms) / 1000)
    out: list[TopicStats] = []
    for name, role in layout.items():
        per = after.offsets[name]
        # A partition whose range past the resume position has no record holds only
        # transaction markers (a transactional producer's commit after the last record): none
        # waiting, where the offsets alone would say one per transaction.
        left = {p: max(0, o.high - o.resume) if (name, p) in found else 0
                for p, o in per.items()}
        waiting = sum(left.values())
        with_commit = [p for p, o in per.items() if o.committed is not None]
        lag = sum(left[p] for p in with_commit) if with_commit else None
        heads_here = [found[(name, p)] for p in per if (name, p) in found]
        oldest = min((head.timestamp_ms for head in heads_here), default=None)
        dues = [head.due_ms for head in heads_here if head.due_ms is not None]
        earlier = before.offsets[name]
        appended = sum(o.high - earlier[p].high for p, o in per.items() if p in earlier)
        consumed: int | None = None
        # From a partition's commit only: with none, the resume position is its first offset,
        # and a first commit within the window would count every offset before it.
        read = [p for p, o in per.items() if p in earlier and earlier[p].committed is not None
                and o.committed is not None]
        if role != DEAD_LETTER and read:
            consumed = sum(per[p].resume - earlier[p].resume for p in read)
        out.append(TopicStats(name, role, len(per), waiting, lag, oldest, min(dues, default=None),
                              appended, consumed, window_s, (retentions or {}).get(name)))
    return out


def collect(connection: kafka.Connection, topic: str, group: str, *,
            policy: RetryPolicy | None = None, window_s: float = 0.0,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> list[TopicStats]:
    """Stats of `group` for `topic`, its retry topics and its dead-letter topic.

    With window_s > 0 the offsets are sampled twice, window_s apart, for the rates.
    """
    topics.check_name("topic", topic)
    topics.check_name("group", group)
    if window_s < 0:
        raise InvalidArgument("window", window_s, "must not be negative")
    admin = kafka.admin(connection)
    counts = kafka.topic_partitions(admin, timeout_s)
    layout = roles(counts, topic, group, policy)
    retentions = {name: after for name, kept in kafka.keeping(
        admin, [name for name, _ in layout.items()], timeout_s).items()
        if (after := kept.deletes_after_ms) is not None}
    # committed() reads the group's offsets; the consumer never subscribes, so never joins it.
    consumer = kafka.consumer(connection, group)
    try:
        first = snapshot(consumer, layout, counts, timeout_s)
        if window_s > 0:
            time.sleep(window_s)
            second = snapshot(consumer, layout, counts, timeout_s)
        else:
            second = first
    finally:
        consumer.close()
    return summarize(layout, first, second, heads(connection, second), retentions)

