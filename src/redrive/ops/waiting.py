"""Where a group's retries wait besides its own retry topics, as the console's overview shows it:
rows of the retry store, and copies in the delay service's shared tiers.

A delay tier holds every group's copies, each naming its group (`redrive-group`) and the topic it
goes back to (`redrive-target`). What waits is what the delay service has not forwarded: each tier
partition from the service group's committed offset to its end. Due times rise with offsets on a
tier, so the front of each partition holds its oldest copy and its next due one; the rest is read
up to READ_CAP copies in all, and counts past it are lower bounds (`complete` says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from redrive import gate, kafka
from redrive import headers as h
from redrive.delay.service import DEFAULT_GROUP
from redrive.delay.tiers import DEAD_LETTER_SUFFIX, DEFAULT_PREFIX
from redrive.errors import MalformedHeader
from redrive.kafka.admin import partition_offsets
from redrive.kafka.ranges import PartitionRange, read_ranges
from redrive.store import RetryStore

STORE = "store"
DELAY_TIERS = "delay tiers"
# Copies read at most from the tiers at every refresh of the overview.
READ_CAP = 10_000
Key = tuple[str, str]  # (group, main topic)


@dataclass(frozen=True)
class DelayTiers:
    """The delay service whose tiers the console reads: its topics' prefix and its group."""

    prefix: str = DEFAULT_PREFIX
    service_group: str = DEFAULT_GROUP


DEFAULT_DELAY = DelayTiers()


@dataclass(frozen=True)
class Waiting:
    where: str  # STORE or DELAY_TIERS
    records: int
    oldest_ms: int | None  # when the oldest of them was stored or written
    next_due_ms: int | None
    complete: bool = True  # False: more wait than were read; `records` is a lower bound


def in_store(store: RetryStore) -> dict[Key, Waiting]:
    """Rows the store has not finished, per group and topic."""
    return {key: Waiting(STORE, count, oldest, due)
            for key, (count, oldest, due) in store.waiting_by_group().items()}


def tier_topics(partitions: Mapping[str, int], prefix: str = DEFAULT_PREFIX) -> list[str]:
    dead = f"{prefix}.{DEAD_LETTER_SUFFIX}"
    return sorted(name for name in partitions if name.startswith(prefix + ".") and name != dead)


def in_delay_tiers(connection: kafka.Connection, delay: DelayTiers, timeout_s: float
                   ) -> dict[Key, Waiting]:
    """Copies in the delay tiers the service has not forwarded yet, per group and target."""
    counts = kafka.topic_partitions(kafka.admin(connection), timeout_s)
    keys = [(name, p) for name in tier_topics(counts, delay.prefix) for p in range(counts[name])]
    if not keys:
        return {}
    consumer = kafka.consumer(connection, delay.service_group)
    try:
        offsets = partition_offsets(consumer, keys)
    finally:
        consumer.close()
    spans = {key: (o.resume, o.high) for key, o in offsets.items() if o.high > o.resume}
    total = sum(high - start for start, high in spans.values())
    ranges = [PartitionRange(topic, p, start,
                             high if total <= READ_CAP
                             else start + max(1, READ_CAP * (high - start) // total))
              for (topic, p), (start, high) in spans.items()]
    found: dict[Key, list[tuple[int, int | None]]] = {}
    for message in read_ranges(connection, ranges, idle_s=timeout_s) if ranges else ():
        try:
            pairs = kafka.message_headers(message)
            group, target = h.text_of(pairs, h.GROUP), h.text_of(pairs, h.TARGET)
            due = gate.due_of(pairs)
        except MalformedHeader:
            continue  # the service dead-letters it; it is not a retry that waits
        if group is not None and target is not None:
            found.setdefault((group, target), []).append((message.timestamp()[1], due))
    complete = all(r.end == spans[(r.topic, r.partition)][1] for r in ranges)
    return {key: Waiting(DELAY_TIERS, len(copies), min(stamp for stamp, _ in copies),
                         min((due for _, due in copies if due is not None), default=None),
                         complete)
            for key, copies in found.items()}
