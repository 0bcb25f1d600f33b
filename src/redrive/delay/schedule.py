"""Scheduling: publish a record that the delay service delivers to its target when it is due."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Producer

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.delay.tiers import DEFAULT_TIERS, Tiers
from redrive.errors import InvalidArgument
from redrive.policy.duration import Duration, to_ms
from redrive.topics import check_name

Instant = datetime | int
# 1973-03-03 as epoch ms: a smaller `at` is taken for epoch seconds (today's are about 1.8e9),
# which read as milliseconds would deliver the record at once.
SECONDS_LOOK_MS = 100_000_000_000


@dataclass(frozen=True)
class Scheduled:
    """Where `schedule` put the record: a tier topic, or the target itself if already due."""

    topic: str
    due_ms: int



def due_ms_of(delay: Duration | None, at: Instant | None, now: int) -> int:
    """The due time from exactly one of `delay` (a duration) and `at` (datetime or epoch ms)."""
    if (delay is None) == (at is None):
        raise InvalidArgument("delay/at", {"delay": delay, "at": at}, "give exactly one of them")
    if delay is not None:
        due = now + to_ms(delay, "delay")
        if due > h.MAX_TIME_MS:
            raise InvalidArgument("delay", delay, "ends past the year 9999")
        return due
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise InvalidArgument("at", at, "needs a time zone (a naive datetime is ambiguous)")
        due = round(at.timestamp() * 1000)
        if due > h.MAX_TIME_MS:
            raise InvalidArgument("at", at, "is past the year 9999 (UTC)")
        # A moment before 1970 is past like any other: delivered now, with a due time that
        # redrive's readers take (they refuse negative ones).
        return max(0, due)
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= h.MAX_TIME_MS:
        raise InvalidArgument("at", at, "expected an aware datetime or epoch milliseconds "
                              "up to the year 9999")
    if at < SECONDS_LOOK_MS:
        raise InvalidArgument("at", at, "is before 1973 as epoch milliseconds: epoch seconds? "
                              "give milliseconds (seconds * 1000) or an aware datetime")
    return at


# Kafka's own topics: listed like any other, and a broker that lets a client write to them
# corrupts its groups' offsets or transactions, one that refuses holds the tier for good.
KAFKA_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state",
                                   "__share_group_state", "__cluster_metadata"})


def check_target(target_topic: str, tiers: Tiers, field: str = "target_topic") -> str:
    check_name(field, target_topic)
    if target_topic in tiers.owned_topics:
        # Forwarding into its own topics would send the record round and round.
        raise InvalidArgument(field, target_topic, "is one of the delay service's own topics")
    if target_topic in KAFKA_INTERNAL_TOPICS:
        raise InvalidArgument(field, target_topic, "is one of Kafka's internal topics")
    return target_topic


def schedule(producer: Producer, target_topic: str, value: bytes | None,
             key: bytes | None = None,
             headers: Iterable[tuple[str, bytes | str | None]] | None = None, *,
             delay: Duration | None = None, at: Instant | None = None,
             tiers: Tiers = DEFAULT_TIERS, group: str | None = None,
             on_delivery: Any = None) -> Scheduled:
    """Publish `value` for delivery to `target_topic` after `delay` or at `at`.

    Key, value and headers reach the target unchanged, plus `redrive-due`, `redrive-target` and,
    when `group` is given, `redrive-group`, so that of the groups reading the target only that one
    handles it. The record is only queued on `producer`: flush it, or commit the producer's
    transaction, to know it was written. A record already due goes straight to its target.
    """
    check_target(target_topic, tiers)
    if group is not None:
        check_name("group", group)
    now = now_ms()
    due = due_ms_of(delay, at, now)
    updates: dict[str, str | int | None] = {h.DUE: due, h.TARGET: target_topic}
    if group is not None:
        updates[h.GROUP] = group
    record_headers = h.replace(h.normalize(headers), updates)
    tier = tiers.next_hop(due - now)
    topic = target_topic if tier is None else tier.topic
    # The timestamp is the instant the hop was chosen at: the service counts the hop from it.
    kafka.produce(producer, kafka.OutRecord(topic, value, key, record_headers, timestamp_ms=now),
                  on_delivery)
    return Scheduled(topic, due)
