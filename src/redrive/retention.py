"""Copies wait in Kafka: a retry topic holds a copy until it falls due, a delay tier holds a
record for the tier's delay. A topic that deletes records sooner (its `retention.ms`) loses them
without a word: the original was committed when its copy was written, and the topic's reader
goes on from the earliest offset left.

`check` refuses, before a runtime starts, a topic that keeps records no longer than they wait
in it, and one that compacts them: compaction keeps only the last record of each key, so a copy
waiting behind a later one with the same key would go. What it cannot prevent, a group stopped
for longer than the retention, `report_gone` tells when the group takes the partitions again: a
log line naming the offsets and the `redrive_lost_offsets` metric. It does not stop the runtime:
nobody can read those records any more, and the partition's other records are still to be
handled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive import kafka
from redrive.errors import RedriveError
from redrive.kafka.admin import partition_offsets
from redrive.kafka.records import PartitionKey
from redrive.metrics import Metrics
from redrive.policy import format_ms

log = logging.getLogger("redrive.retention")
# How long an assignment waits for the offsets that report_gone compares, per request.
REPORT_TIMEOUT_S = 5.0


class RetentionTooShort(RedriveError):
    """A topic where records wait deletes them before they are due."""

    def __init__(self, topic: str, retention_ms: int, wait_ms: int) -> None:
        self.topic = topic
        self.retention_ms = retention_ms
        self.wait_ms = wait_ms
        super().__init__(
            f"topic {topic!r} has retention.ms={retention_ms} ({format_ms(retention_ms)}), no "
            f"longer than the {format_ms(wait_ms)} a record waits there: each would be deleted "
            f"before it is due. Raise retention.ms on {topic!r} well above "
            f"{format_ms(wait_ms)} (what waits there while its group is stopped for longer "
            "than that is lost too), or shorten the delay")


class CompactedTopic(RedriveError):
    """A topic where records wait compacts them: copies of one key replace each other."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(
            f"topic {topic!r} has cleanup.policy=compact: compaction keeps only the last record "
            "of each key, so a record waiting there for its retry would be removed once a later "
            f"record with its key arrives. Set cleanup.policy=delete on {topic!r}")


def check(admin: AdminClient, waits: Mapping[str, int]) -> None:
    """Raise CompactedTopic or RetentionTooShort for the first topic that compacts, or keeps
    records no longer than the wait (ms) given for it. Topics the cluster does not describe to
    this client are not judged."""
    found = kafka.keeping(admin, list(waits))
    for topic, wait_ms in waits.items():
        kept = found.get(topic)
        if kept is None:
            continue
        if kept.compacts:
            raise CompactedTopic(topic)
        after = kept.deletes_after_ms
        if after is not None and after <= wait_ms:
            raise RetentionTooShort(topic, after, wait_ms)


def report_gone(group_consumer: Consumer, tps: list[PartitionKey], metrics: Metrics,
                who: str) -> dict[PartitionKey, int]:
    """Log and count, for partitions of the group's own that `group_consumer`'s group takes,
    the offsets it never committed past that the partition no longer holds; return how many,
    by partition. Every record of such a partition is the group's (its retry topics, the
    service's tiers), so from offset 0 when it never committed there. Transaction markers take
    offsets too: at most that many records. Called in a rebalance callback: a broker that does
    not answer is logged, not raised (reading goes on as it would without the check)."""
    try:
        # The rebalance waits for this callback: a broker slow to answer costs one timeout.
        offsets = partition_offsets(group_consumer, tps, timeout_s=REPORT_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("%s: could not check %d partition(s) for records deleted before they were "
                    "read: %s", who, len(tps), exc.args[0])
        return {}
    gone: dict[PartitionKey, int] = {}
    for (topic, partition), found in offsets.items():
        start = found.committed or 0
        if found.low <= start:
            continue
        gone[(topic, partition)] = found.low - start
        # With nothing committed, handled records whose commit expired look the same.
        unless = "" if found.committed is not None else (
            " (unless the group's committed offsets expired after it handled them: "
            "offsets.retention.minutes)")
        log.error("%s: %s[%d] no longer holds offsets %d to %d, which the group had not "
                  "committed: deleted (retention.ms, or DeleteRecords) while it was stopped or "
                  "behind. Their originals were committed when they were written: up to %d "
                  "record(s) lost%s. Reading on from offset %d", who, topic, partition, start,
                  found.low - 1, found.low - start, unless, found.low)
        metrics.lost(topic, found.low - start)
    if gone:
        # Committed at once, so that the gap is reported once: left uncommitted (a partition
        # that receives nothing more is never committed past it) every later assignment, here
        # or in another member, and every restart, would log and count the same records again.
        # The offsets are gone, so nothing can be read below `low` anyway.
        try:
            # Synchronous: the runtimes count their own asynchronous commits' answers.
            group_consumer.commit(offsets=[TopicPartition(t, p, offsets[(t, p)].low)
                                           for t, p in gone], asynchronous=False)
        except KafkaException as exc:
            log.warning("%s: could not commit past the deleted offsets (%s); they will be "
                        "reported again at the next assignment", who, exc.args[0])
    return gone
