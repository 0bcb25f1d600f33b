"""Cluster metadata and topic administration, each failure naming the bootstrap address."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

# Where confluent-kafka defines them: its package re-exports them without saying so to mypy.
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from redrive.errors import BrokerUnavailable, RedriveError, UnknownTopic
from redrive.kafka.causes import drop_stack
from redrive.kafka.config import Admin, Connection, admin, consumer
from redrive.kafka.records import PartitionKey


def topic_partitions(admin_: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    """Every topic on the cluster with its partition count; raises BrokerUnavailable."""
    try:
        metadata = admin_.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailable(_bootstrap(admin_), str(exc.args[0])) from exc
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()
            if topic.error is None}


def partition_count(admin_: AdminClient, topic: str, timeout_s: float = 10.0) -> int:
    counts = topic_partitions(admin_, timeout_s)
    if topic not in counts:
        raise UnknownTopic(topic)
    return counts[topic]


def create_topics(admin_: AdminClient, topics: Mapping[str, int], *,
                  replication_factor: int = -1, config: Mapping[str, str] | None = None,
                  timeout_s: float = 30.0) -> list[str]:
    """Create topics that do not exist yet; return the names created. Existing ones are left."""
    if not topics:
        return []
    new = [NewTopic(name, num_partitions=count, replication_factor=replication_factor,
                    config=dict(config or {})) for name, count in topics.items()]
    futures = admin_.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except TimeoutError as exc:
            raise BrokerUnavailable(_bootstrap(admin_), f"creating topic {name!r} got no "
                                    f"answer in {timeout_s:g} s") from exc
        except KafkaException as exc:
            error = exc.args[0]
            code = error.code() if isinstance(error, KafkaError) else None
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                drop_stack(exc)  # the future keeps it, and the callers' frames through it
                continue
            if code in UNANSWERED:  # librdkafka's own timeout may come first
                raise BrokerUnavailable(_bootstrap(admin_), f"creating topic {name!r} got no "
                                        f"answer in {timeout_s:g} s ({error})") from exc
            raise TopicNotCreated(name, error) from exc
    return created


class TopicNotCreated(RedriveError, KafkaException):
    """The broker refused to create a topic (a replication factor above the brokers' count, an
    illegal name...). A KafkaException still, with the broker's error as args[0], for callers
    that handle those; a RedriveError, so the command prints it as one line naming the topic."""

    def __init__(self, topic: str, error: object) -> None:
        super().__init__(error)
        self.topic = topic

    def __str__(self) -> str:
        error = self.args[0]
        why = error.str() if isinstance(error, KafkaError) else str(error)
        return f"creating topic {self.topic!r} failed: {why}"


UNANSWERED = (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)


# A topic's limit on the size of a record batch, and so of one record, and Kafka's default.
RECORD_LIMIT = "max.message.bytes"
KAFKA_RECORD_LIMIT = 1_048_588


@dataclass(frozen=True)
class RecordLimit:
    """A topic's `max.message.bytes`; `own`: set on the topic, not the cluster's default."""

    bytes: int
    own: bool


def record_limits(admin_: AdminClient, topics: Sequence[str],
                  timeout_s: float = 10.0) -> dict[str, RecordLimit]:
    """Each topic's record size limit. A topic whose configs the cluster does not describe to
    this client (unknown, or not authorised) is left out; raises BrokerUnavailable."""
    own = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    return {name: RecordLimit(int(configs[RECORD_LIMIT][0]), configs[RECORD_LIMIT][1] == own)
            for name, configs in _topic_configs(admin_, topics, timeout_s).items()
            if RECORD_LIMIT in configs}


@dataclass(frozen=True)
class Keeping:
    """How long a topic keeps records (`retention.ms`, -1: for ever; applied only where its
    `cleanup.policy` deletes), and whether it compacts them (keeping the last record per key)."""

    retention_ms: int
    deletes: bool
    compacts: bool

    @property
    def deletes_after_ms(self) -> int | None:
        """How long a record stays before retention deletes it; None: it is not deleted by
        time."""
        return self.retention_ms if self.deletes and self.retention_ms >= 0 else None


def keeping(admin_: AdminClient, topics: Sequence[str],
            timeout_s: float = 10.0) -> dict[str, Keeping]:
    """Each topic's Keeping, as record_limits leaves topics out."""
    kept: dict[str, Keeping] = {}
    for name, configs in _topic_configs(admin_, topics, timeout_s).items():
        if "retention.ms" in configs:
            policy = configs.get("cleanup.policy", ("delete", 0))[0].replace(" ", "").split(",")
            kept[name] = Keeping(int(configs["retention.ms"][0]), "delete" in policy,
                                 "compact" in policy)
    return kept


def _topic_configs(admin_: AdminClient, topics: Sequence[str],
                   timeout_s: float) -> dict[str, dict[str, tuple[str, int]]]:
    """Each topic's configs that have a value, each with where it comes from (a ConfigSource
    value)."""
    if not topics:
        return {}
    futures = admin_.describe_configs([ConfigResource(ResourceType.TOPIC, name)
                                       for name in dict.fromkeys(topics)],
                                      request_timeout=timeout_s)
    found: dict[str, dict[str, tuple[str, int]]] = {}
    for resource, future in futures.items():
        try:
            entries = future.result(timeout=timeout_s)
        except TimeoutError as exc:
            raise BrokerUnavailable(_bootstrap(admin_), f"describing topic {resource.name!r} "
                                    f"got no answer in {timeout_s:g} s") from exc
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() in UNANSWERED:
                raise BrokerUnavailable(_bootstrap(admin_), str(error)) from exc
            drop_stack(exc)  # as in create_topics
            continue
        found[resource.name] = {name: (entry.value, entry.source)
                                for name, entry in entries.items() if entry.value is not None}
    return found


def group_members(admin_: AdminClient, group: str, timeout_s: float = 10.0) -> int | None:
    """How many members `group` has now: 0 when no consumer of it is running (or it never
    existed: Kafka describes an unknown group as dead, with none); None when the cluster does
    not let this client describe it."""
    try:
        described = admin_.describe_consumer_groups(
            [group], request_timeout=timeout_s)[group].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0]
        code = error.code() if isinstance(error, KafkaError) else None
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            return 0
        if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return None
        raise BrokerUnavailable(_bootstrap(admin_), str(error)) from exc
    except TimeoutError as exc:
        raise BrokerUnavailable(_bootstrap(admin_), f"describing group {group!r} got no answer "
                                f"in {timeout_s:g} s") from exc
    return len(described.members)


def delete_topics(admin_: AdminClient, topics: Sequence[str], *,
                  timeout_s: float = 30.0) -> None:
    """Delete topics and wait until the broker has; raises KafkaException naming a failure."""
    if not topics:
        return
    futures = admin_.delete_topics(list(topics), operation_timeout=timeout_s,
                                   request_timeout=timeout_s)
    for future in futures.values():
        future.result(timeout=timeout_s)


def watermarks(consumer_: Consumer, topic: str, partition: int,
               timeout_s: float = 10.0) -> tuple[int, int]:
    """The partition's first offset and its end (the next offset to be written)."""
    low, high = consumer_.get_watermark_offsets(TopicPartition(topic, partition),
                                                timeout=timeout_s)
    return int(low), int(high)


def check_reachable(connection: Connection, timeout_s: float = 5.0) -> None:
    """Raise BrokerUnavailable with the bootstrap address if no broker answers in time."""
    topic_partitions(admin(connection), timeout_s)


def _bootstrap(admin_: AdminClient) -> str:
    return admin_.bootstrap if isinstance(admin_, Admin) else "the configured bootstrap.servers"


@dataclass(frozen=True)
class PartitionOffsets:
    """A partition's first and end offsets, and what a group committed there (None: nothing)."""

    low: int
    high: int
    committed: int | None

    @property
    def resume(self) -> int:
        """Where the group reads on: its committed offset, or the first offset when it committed
        nothing or what it committed is gone."""
        return self.low if self.committed is None else max(self.low, self.committed)


def partition_offsets(group_consumer: Consumer, tps: Sequence[PartitionKey],
                      timeout_s: float = 10.0) -> dict[PartitionKey, PartitionOffsets]:
    """Offsets of each partition, with the committed ones of `group_consumer`'s group (the
    consumer is only asked: it never subscribes, so never joins the group)."""
    if not tps:
        return {}
    committed = {(str(tp.topic), int(tp.partition)): int(tp.offset)
                 for tp in group_consumer.committed([TopicPartition(t, p) for t, p in tps],
                                                    timeout=timeout_s)}
    offsets: dict[PartitionKey, PartitionOffsets] = {}
    for tp in tps:
        low, high = watermarks(group_consumer, tp[0], tp[1], timeout_s)
        mark = committed.get(tp, -1)
        offsets[tp] = PartitionOffsets(low, high, mark if mark >= 0 else None)
    return offsets


def waiting_past(connection: Connection, group: str, topics: Iterable[str],
                 partitions: Mapping[str, int]) -> dict[str, int]:
    """How many offsets each topic holds past `group`'s committed offsets (from its first offset
    where the group committed nothing); `partitions`: each topic's partition count."""
    names = sorted(set(topics))
    if not names:
        return {}
    # committed() reads the group's offsets; the consumer never subscribes, so never joins it.
    group_consumer = consumer(connection, group)
    try:
        offsets = partition_offsets(group_consumer, [(name, p) for name in names
                                                     for p in range(partitions[name])])
    finally:
        group_consumer.close()
    waiting = dict.fromkeys(names, 0)
    for (name, _), found in offsets.items():
        # A commit past the partition's end (the topic was recreated) leaves nothing waiting
        # there; counted below zero it would cancel what waits in the other partitions.
        waiting[name] += max(0, found.high - found.resume)
    return waiting
