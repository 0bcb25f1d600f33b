"""Topic naming and the TopicPlan a policy needs for one (topic, group).

Default naming gives one retry topic per distinct delay (`orders.billing.retry.5m`): records of one
retry topic all waited the same delay, so due times rise with offsets, and the topic count stays
bounded however many attempts a policy allows. Per-attempt naming (`orders.billing.retry.2`)
is the Spring Kafka style.

Either way a retry topic's name comes from the policy, so another backoff, naming or retry backend
gives a group other retry topics, and copies still waiting in the old ones would be read by no
one. `former_retry_topics` finds those that still hold records past the group's offsets, for a
runtime to read until they are handled.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from redrive import kafka
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.kafka.admin import KAFKA_RECORD_LIMIT, RECORD_LIMIT, waiting_past
from redrive.policy import Naming, RetryPolicy, format_ms

log = logging.getLogger("redrive.topics")

SEPARATOR = "."
# What follows `<topic>.<group>.retry.`: a delay as format_ms spells it, or an attempt number.
_RETRY_SUFFIX = re.compile(r"[0-9]+(?:ms|s|m|h|d)?")
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
MAX_TOPIC_LENGTH = 249


def check_name(field: str, value: str) -> str:
    """Topic and group names become parts of topic names, so they must be legal there."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(field, value, "must be a non-empty string")
    if not _LEGAL.fullmatch(value):  # match() and $ would take a name ending in a newline
        raise InvalidArgument(field, value, "may contain only letters, digits, '.', '_' and '-'")
    if value in (".", ".."):
        raise InvalidArgument(field, value, "is not a name Kafka takes")
    if len(value) > MAX_TOPIC_LENGTH:
        raise InvalidArgument(field, value, f"is longer than {MAX_TOPIC_LENGTH} characters")
    return value


def check_names(field: str, value: str | Iterable[str]) -> list[str]:
    """One topic name or several, each legal, none twice, at least one."""
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise InvalidArgument(field, value, "name at least one topic")
    for name in names:
        check_name(field, name)
    if len(set(names)) != len(names):
        raise InvalidArgument(field, value, "names a topic twice")
    return names


@dataclass(frozen=True)
class RetryTopic:
    name: str
    delay_ms: int
    retries: tuple[int, ...]  # which retries (1-based) this topic carries
    wait_ms: int  # the longest a copy waits here: delay_ms, or more with jitter

    @property
    def delay(self) -> str:
        return format_ms(self.delay_ms)


@dataclass(frozen=True)
class TopicPlan:
    topic: str
    group: str
    retry_topics: tuple[RetryTopic, ...]
    dead_letter: str | None

    def retry_topic_for(self, retry: int) -> RetryTopic:
        for candidate in self.retry_topics:
            if retry in candidate.retries:
                return candidate
        raise InvalidArgument("retry", retry, f"the plan for {self.topic!r} has no such retry")

    @property
    def retry_topic_names(self) -> list[str]:
        return [topic.name for topic in self.retry_topics]

    @property
    def waits(self) -> dict[str, int]:
        """Each retry topic with the time (ms) its copies wait there."""
        return {topic.name: topic.wait_ms for topic in self.retry_topics}

    @property
    def consumed_topics(self) -> list[str]:
        """What the group reads: the main topic and its retry topics."""
        return [self.topic, *self.retry_topic_names]

    @property
    def created_topics(self) -> list[str]:
        """What the plan adds to the cluster: retry topics and the dead-letter topic."""
        dlt = [self.dead_letter] if self.dead_letter else []
        return [*self.retry_topic_names, *dlt]


def retry_topic_name(topic: str, group: str, suffix: str) -> str:
    return SEPARATOR.join((topic, group, "retry", suffix))


def retried_topic(name: str, group: str) -> str | None:
    """The topic whose retry topic for `group` `name` is by redrive's naming (either kind), or
    None when `name` is not one."""
    marker = SEPARATOR.join(("", group, "retry", ""))
    at = name.rfind(marker)
    if at <= 0 or not _RETRY_SUFFIX.fullmatch(name, at + len(marker)):
        return None
    return name[:at]


def former_retry_topics(connection: kafka.Connection, group: str, mains: Iterable[str],
                        consumed: Collection[str], partitions: Mapping[str, int]) -> dict[str, str]:
    """The group's retry topics on the cluster (`partitions`: every topic's partition count)
    that it no longer reads (`consumed`) but that hold records past its committed offsets, each
    with its main topic; each is logged once with the count it holds."""
    wanted = set(mains)
    former = {name: main for name in partitions if name not in consumed
              and (main := retried_topic(name, group)) is not None and main in wanted}
    waiting = waiting_past(connection, group, former, partitions)
    for name in sorted(former):
        if waiting[name] > 0:
            log.warning("group %s: %s is not among the policy's retry topics but holds up to %d "
                        "records past the group's offsets (an earlier policy's); reading it "
                        "too, so that they are handled", group, name, waiting[name])
    return {name: main for name, main in former.items() if waiting[name] > 0}


def dead_letter_name(topic: str, group: str) -> str:
    return SEPARATOR.join((topic, group, "dlt"))


def dead_letter_owner(name: str, existing: Collection[str]) -> tuple[str, str] | None:
    """The (main topic, group) whose dead-letter topic `name` is by redrive's naming, or None.

    Topic and group names may both hold dots, so `orders.billing.v2.dlt` is of orders and group
    billing.v2, or of orders.billing and group v2: the split whose main topic is among
    `existing` wins, else the last dot. (Their retry topics share their names too.)
    """
    stem = name.removesuffix(SEPARATOR + "dlt")
    if stem == name:
        return None
    splits = [(stem[:at], stem[at + 1:]) for at in range(1, len(stem) - 1)
              if stem[at] == SEPARATOR]
    present = [(topic, group) for topic, group in splits if topic in existing]
    choices = present or splits
    return choices[-1] if choices else None


PIPELINE_LEDGER_PREFIX = "redrive.pipeline."


def pipeline_ledger_name(group: str) -> str:
    """A Spark pipeline's batch ledger: one partition, shared by all the group's main topics."""
    check_name("group", group)
    name = PIPELINE_LEDGER_PREFIX + group
    # The prefix is longer than what retry and dead-letter names add, so a group that passes
    # plan() can still give a ledger name the broker refuses.
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidArgument("group", group, f"the Spark batch ledger topic "
                              f"{PIPELINE_LEDGER_PREFIX}<group> would be {len(name)} characters, "
                              f"longer than {MAX_TOPIC_LENGTH}")
    return name


@functools.lru_cache(maxsize=1024)
def plan(policy: RetryPolicy, topic: str, group: str) -> TopicPlan:
    """The retry and dead-letter topics `group` needs to retry records of `topic` under `policy`."""
    check_name("topic", topic)
    check_name("group", group)
    by_suffix: dict[str, tuple[int, list[int]]] = {}
    for retry, delay in enumerate(policy.retry_delays_ms(), start=1):
        suffix = str(retry) if policy.topic_naming is Naming.PER_ATTEMPT else format_ms(delay)
        by_suffix.setdefault(suffix, (delay, []))[1].append(retry)
    retry_topics = tuple(
        RetryTopic(check_name("retry topic", retry_topic_name(topic, group, suffix)), delay,
                   tuple(retries), max(policy.backoff.longest_ms(retry) for retry in retries))
        for suffix, (delay, retries) in by_suffix.items())
    dlt = check_name("dead-letter topic", dead_letter_name(topic, group)) \
        if policy.dead_letter else None
    return TopicPlan(topic, group, retry_topics, dlt)


def partition_for(preferred: int | None, partitions: int) -> int | None:
    """Keep the source partition if the copy's topic has it; else let the key decide (None)."""
    if preferred is None or preferred < 0 or preferred >= partitions:
        return None
    return preferred


@dataclass(frozen=True)
class Mismatch:
    topic: str
    partitions: int
    needed: int

    def __str__(self) -> str:
        return (f"{self.topic} has {self.partitions} partitions, fewer than {self.needed} of the "
                "source topic: copies of higher partitions are placed by key, not by partition")


@dataclass(frozen=True)
class SmallerLimit:
    """A topic that takes smaller records than its source topic (`max.message.bytes`), or a
    client that sends smaller ones (`client`: the connection's `message.max.bytes`)."""

    topic: str
    limit: int
    needed: int
    client: bool = False

    def __str__(self) -> str:
        if self.client:
            return (f"{self.topic} takes records up to {self.needed:,} bytes, but redrive's "
                    f"clients send at most {self.limit:,} (message.max.bytes): a failed record "
                    "larger than that cannot be copied; set message.max.bytes to at least "
                    f"{self.needed:,} in the settings of redrive's producer")
        return (f"{self.topic} takes records up to {self.limit:,} bytes (max.message.bytes), "
                f"fewer than the {self.needed:,} of its source topic: copies of larger records "
                "cannot be written there")


@dataclass(frozen=True)
class EnsureReport:
    created: tuple[str, ...]
    existing: tuple[str, ...]
    mismatched: tuple[Mismatch | SmallerLimit, ...]


def ensure_topics(admin: AdminClient, topic_plan: TopicPlan, *, partitions: int | None = None,
                  replication_factor: int = -1,
                  config: Mapping[str, str] | None = None) -> EnsureReport:
    """Create the plan's missing topics, with as many partitions as the source topic by default,
    and its `max.message.bytes` where the source topic was set to take records larger than
    Kafka's default (a copy is the record plus headers: it must fit where the record did).

    Existing topics are left as they are; those with fewer partitions than the source topic are
    reported, because partition-preserving routing cannot keep their records' partitions, and
    so are those that take smaller records than the source topic, and a connection whose
    clients send smaller records than the source topic was set to take.
    """
    counts = kafka.topic_partitions(admin)
    if topic_plan.topic not in counts and partitions is None:
        raise UnknownTopic(topic_plan.topic)
    needed = partitions if partitions is not None else counts[topic_plan.topic]
    if needed < 1:
        raise InvalidArgument("partitions", needed, "must be >= 1")
    missing = [name for name in topic_plan.created_topics if name not in counts]
    existing = [name for name in topic_plan.created_topics if name in counts]
    limits = kafka.record_limits(admin, [topic_plan.topic, *existing]) \
        if topic_plan.topic in counts else {}
    source_limit = limits.get(topic_plan.topic)
    new_config = dict(config or {})
    # Raised, never lowered: a new topic's limit below the cluster's default would refuse
    # batches that redrive's producer builds up to its own batch.size.
    if source_limit is not None and source_limit.own and source_limit.bytes > KAFKA_RECORD_LIMIT:
        new_config.setdefault(RECORD_LIMIT, str(source_limit.bytes))
    created = kafka.create_topics(admin, {name: needed for name in missing},
                                  replication_factor=replication_factor, config=new_config)
    source = counts.get(topic_plan.topic, needed)
    mismatched: list[Mismatch | SmallerLimit] = [
        Mismatch(name, counts[name], source) for name in existing if counts[name] < source]
    if source_limit is not None:
        mismatched.extend(SmallerLimit(name, limits[name].bytes, source_limit.bytes)
                          for name in existing
                          if name in limits and limits[name].bytes < source_limit.bytes)
        if source_limit.own and isinstance(admin, kafka.Admin) \
                and admin.record_limit < source_limit.bytes:
            mismatched.append(SmallerLimit(topic_plan.topic, admin.record_limit,
                                           source_limit.bytes, client=True))
    return EnsureReport(tuple(created), tuple(existing), tuple(mismatched))


def plans(policy: RetryPolicy, topics: Iterable[str], group: str) -> dict[str, TopicPlan]:
    return {topic: plan(policy, topic, group) for topic in topics}
