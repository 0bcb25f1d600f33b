"""The one thin layer over confluent-kafka: client configs, confirmed produce, admin calls.

Nothing else in redrive builds a raw client config. Callers pass either a bootstrap address or a
mapping of librdkafka settings (the user's own, such as security settings), plus overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from redrive.errors import BrokerUnavailable, DeliveryFailed, InvalidArgument, UnknownTopic

if TYPE_CHECKING:
    from redrive._rangeread import RangeReader

ClientConfig = dict[str, Any]
Connection = str | Mapping[str, Any]

PRODUCER_DEFAULTS: Mapping[str, Any] = {
    # Retry and dead-letter copies must not be duplicated or reordered by producer retries.
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
}
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    # redrive commits only what it finished or routed, never on a timer.
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}
# For reading a given offset range by assign: end-of-partition events tell how far the partition
# goes, and a fetch the broker answers "offset out of range" is reported to the reader rather
# than jumped past (auto.offset.reset), so no record of the range is skipped unseen.
RANGE_READ_DEFAULTS: Mapping[str, Any] = {
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}


def client_config(connection: Connection,
                  overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    """A librdkafka config from a bootstrap address or a user config, with overrides on top."""
    if isinstance(connection, str):
        config: ClientConfig = {"bootstrap.servers": connection}
    else:
        config = dict(connection)
    if not config.get("bootstrap.servers"):
        raise BrokerUnavailable(str(config.get("bootstrap.servers", "")),
                                "bootstrap.servers is not set")
    config.update(overrides or {})
    return config


def producer_config(connection: Connection, *, transactional_id: str | None = None,
                    overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    config = client_config(connection, {**PRODUCER_DEFAULTS, **(overrides or {})})
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


def consumer_config(connection: Connection, group_id: str | None = None,
                    overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    config = client_config(connection, {**CONSUMER_DEFAULTS, **(overrides or {})})
    if group_id is not None:
        config["group.id"] = group_id
    elif "group.id" not in config:
        # librdkafka needs a group id even for assign-only consumers that never commit.
        config["group.id"] = "redrive-unused"
    return config


def producer(connection: Connection, *, transactional_id: str | None = None,
             overrides: Mapping[str, Any] | None = None) -> Producer:
    return Producer(producer_config(connection, transactional_id=transactional_id,
                                    overrides=overrides))


def consumer(connection: Connection, group_id: str | None = None,
             overrides: Mapping[str, Any] | None = None) -> Consumer:
    return Consumer(consumer_config(connection, group_id, overrides))


def range_reader(connection: Connection, topic: str, partition: int, start: int, end: int, *,
                 include_headers: bool, poll_timeout_s: float, skip_lost: bool = False,
                 overrides: Mapping[str, Any] | None = None) -> RangeReader:
    """redrive._rangeread's reader of offsets [start, end) of one partition, configured as an
    assign-only consumer; raises ImportError when the extension was not built. skip_lost: read
    on past records the broker no longer has, instead of failing."""
    from redrive import _rangeread

    config = consumer_config(connection, None, {**(overrides or {}), **RANGE_READ_DEFAULTS})
    settings: list[tuple[str, str]] = []
    for name, value in config.items():
        if callable(value):
            raise InvalidArgument(name, value, "a callback cannot be set on the native reader")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        settings.append((name, text))
    return _rangeread.RangeReader(settings, topic, partition, start, end, include_headers,
                                  max(1, round(poll_timeout_s * 1000)), skip_lost)


class Admin(AdminClient):
    """An AdminClient that remembers its bootstrap address, so errors can name it."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self.bootstrap = str(config["bootstrap.servers"])


def admin(connection: Connection, overrides: Mapping[str, Any] | None = None) -> Admin:
    return Admin(client_config(connection, overrides))


@dataclass(frozen=True)
class OutRecord:
    """A record to produce. Headers are (name, bytes) pairs, kept in order."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


def produce(producer_: Producer, record: OutRecord,
            on_delivery: Any = None) -> None:
    """Queue one record, waiting for queue space instead of failing when the local queue is full."""
    kwargs: dict[str, Any] = {"value": record.value, "key": record.key,
                              "headers": list(record.headers)}
    if record.partition is not None and record.partition >= 0:
        kwargs["partition"] = record.partition
    if record.timestamp_ms is not None:
        kwargs["timestamp"] = record.timestamp_ms
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    while True:
        try:
            producer_.produce(record.topic, **kwargs)
            return
        except BufferError:
            producer_.poll(0.05)


def produce_confirmed(producer_: Producer, records: Iterable[OutRecord],
                      timeout_s: float = 30.0) -> list[Delivered]:
    """Produce records and return only once the broker acknowledged every one of them.

    Raises DeliveryFailed naming the first failed record's topic and partition if any delivery
    failed or was still unconfirmed at the timeout; the caller must then not commit past them.
    """
    results: list[Delivered | None] = []
    failures: list[DeliveryFailed] = []

    def callback_for(index: int, topic: str) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(DeliveryFailed(topic, msg.partition(), err.str()))
            else:
                results[index] = Delivered(str(msg.topic()), int(msg.partition() or 0),
                                           int(msg.offset() or 0))
        return on_delivery

    for index, record in enumerate(records):
        results.append(None)
        produce(producer_, record, callback_for(index, record.topic))
    remaining = producer_.flush(timeout_s)
    if failures:
        raise failures[0]
    if remaining > 0 or any(result is None for result in results):
        raise DeliveryFailed(records_topic(results), None,
                             f"{remaining} record(s) unconfirmed after {timeout_s}s")
    return [result for result in results if result is not None]


def records_topic(results: Sequence[Delivered | None]) -> str:
    return next((r.topic for r in results if r is not None), "<unconfirmed>")


def topic_partitions(admin_: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    """Every topic on the cluster with its partition count; raises BrokerUnavailable."""
    try:
        metadata = admin_.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailable(_admin_bootstrap(admin_), str(exc.args[0])) from exc
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
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise
    return created


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
    low, high = consumer_.get_watermark_offsets(TopicPartition(topic, partition),
                                                timeout=timeout_s)
    return int(low), int(high)


def message_headers(message: Message) -> list[tuple[str, bytes]]:
    return normalize_headers(message.headers())


def normalize_headers(raw: Any) -> list[tuple[str, bytes]]:
    """Headers as Message.headers() returns them (None when there are none) as (str, bytes)."""
    if not raw:
        return []
    for _, value in raw:
        if value is None:
            return [(name, b"" if value is None else value) for name, value in raw]
    # Already (str, bytes) pairs: the Message's own list, handed on as it is.
    return raw  # type: ignore[no-any-return]


def check_reachable(connection: Connection, timeout_s: float = 5.0) -> None:
    """Raise BrokerUnavailable with the bootstrap address if no broker answers in time."""
    topic_partitions(admin(connection), timeout_s)


def _admin_bootstrap(admin_: AdminClient) -> str:
    return admin_.bootstrap if isinstance(admin_, Admin) else "the configured bootstrap.servers"
