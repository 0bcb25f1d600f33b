"""`redrive-kafka`: a PySpark data source for Kafka with the schema and options of Spark's own.

It reads like `spark.readStream.format("kafka")` (same columns, same option names where they
apply) and adds the due gate: a planned micro-batch ends before the first record whose
`redrive-due` lies in the future, so no record reaches the query before its due time.

Offsets, in the checkpoint and between the methods below, are JSON dicts of the next offset to read
per partition: `{"orders": {"0": 12, "1": 40}}`. The driver plans ranges; executors read exactly
`[start, end)` of one Kafka partition each.

The gate scan. Reading headers costs a full fetch of every record, so the driver scans only the
topics the gate applies to: those named by `redrive.gatedTopics` (comma list; each entry is a
topic name or a regular expression matching whole names), or every subscribed topic when that
option is absent. Per partition the driver remembers how far it has scanned and the first record
held back with its due time; a held partition is not read again until that due time has passed,
and records already found due are never scanned twice. Topics outside the gate are not scanned.
"""

from __future__ import annotations

import bisect
import importlib
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from redrive import gate, kafka
from redrive import headers as h
from redrive.errors import BrokerUnavailable, RedriveError
from redrive.spark import collector

log = logging.getLogger(__name__)

SOURCE_NAME = "redrive-kafka"

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as in Spark
LATEST = -1

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost, small enough
# to keep an executor's memory flat; a batch of large records ends earlier, at about
# ARROW_BATCH_BYTES of keys and values (which also keeps binary offsets within int32).
ARROW_BATCH_ROWS = 20_000
ARROW_BATCH_BYTES = 64 << 20
NATIVE_MISSING = ("the native reader (redrive._rangeread) is not built: install librdkafka's "
                  "development files (Debian: librdkafka-dev), then reinstall redrive")
FETCH_MISSING = ("the fetch reader (redrive._fetchread) is not built: it needs a C compiler and "
                 "Python's headers when redrive is installed")
READERS = ("auto", "fetch", "native", "python")
# Records per consume(): a few thousand Message objects stay in the CPU caches while their fields
# are read out; 2,000 to 10,000 measured alike, 50,000 and more were measurably slower.
CONSUME_BATCH = 5_000
POLL_S = 0.5

TopicPartitionKey = tuple[str, int]
Offsets = dict[TopicPartitionKey, int]


class SourceOptionError(RedriveError, ValueError):
    """An option of the redrive-kafka source is missing or has a value it cannot use."""

    def __init__(self, option: str, value: object, why: str) -> None:
        self.option = option
        self.value = value
        super().__init__(f"redrive-kafka option {option}={value!r}: {why}")


class KafkaReadFailed(RedriveError):
    """An executor could not read the planned range of a partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int, why: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"reading {topic}[{partition}] offsets [{start}, {end}) failed: {why}")


class DataLoss(RedriveError):
    """Records the query still had to read are gone (retention, deletion, topic recreated)."""

    def __init__(self, topic: str, partition: int, why: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"data loss on {topic}[{partition}]: {why}; set option "
                         "failOnDataLoss=false to continue from what is left")


# --- schema --------------------------------------------------------------------------------


HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))


def kafka_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's built-in Kafka source (KafkaRecordToRowConverter), field for field."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


# --- options -------------------------------------------------------------------------------

# Options whose meaning the source owns; a user setting them via kafka.* would break reading.
_FORBIDDEN_CLIENT = {
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "offsets are committed by the query (see redrive.group)",
}
_UNSUPPORTED = {
    "assign": "use subscribe with a comma list of topics",
    "subscribepattern": "use subscribe with a comma list of topics",
}


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise SourceOptionError(name, raw, "expected true or false")
    return text == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SourceOptionError(name, raw, "expected a positive integer") from None
    if value <= 0:
        raise SourceOptionError(name, raw, "expected a positive integer")
    return value


OffsetsSpec = str | dict[TopicPartitionKey, int]  # "earliest", "latest" or explicit offsets


def _offsets_spec(options: Mapping[str, str], name: str,
                  topics: Sequence[str]) -> OffsetsSpec | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise SourceOptionError(name, raw, 'expected earliest, latest or JSON such as '
                                '{"topic": {"0": 23, "1": -2}}') from None
    if not isinstance(parsed, dict):
        raise SourceOptionError(name, raw, 'expected a JSON object such as {"topic": {"0": 23}}')
    spec: dict[TopicPartitionKey, int] = {}
    for topic, partitions in parsed.items():
        if topic not in topics:
            raise SourceOptionError(name, raw, f"topic {topic!r} is not in subscribe")
        if not isinstance(partitions, dict):
            raise SourceOptionError(name, raw, f"topic {topic!r}: expected an object of "
                                    "partition -> offset")
        for partition, offset in partitions.items():
            if not str(partition).isdigit():
                raise SourceOptionError(name, raw, f"topic {topic!r}: partition {partition!r} "
                                        "is not a non-negative integer")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise SourceOptionError(name, raw, f"{topic}[{partition}]: offset {offset!r} "
                                        "must be an offset, -2 (earliest) or -1 (latest)")
            spec[(topic, int(partition))] = offset
    return spec


def _gated_topics(options: Mapping[str, str]) -> tuple[re.Pattern[str], ...] | None:
    raw = options.get("redrive.gatedtopics")
    if raw is None:
        return None
    patterns: list[re.Pattern[str]] = []
    for entry in (part.strip() for part in str(raw).split(",")):
        if not entry:
            continue
        try:
            patterns.append(re.compile(entry))
        except re.error as exc:
            raise SourceOptionError("redrive.gatedTopics", raw,
                                    f"{entry!r} is not a topic name or regular expression: "
                                    f"{exc}") from None
    return tuple(patterns)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated: every bad value is reported by option name and value."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: OffsetsSpec | None
    ending: OffsetsSpec | None
    max_offsets_per_trigger: int | None
    include_headers: bool
    client_overrides: dict[str, str]
    gate: bool
    gated_topics: tuple[re.Pattern[str], ...] | None
    group: str | None
    fail_on_data_loss: bool
    poll_timeout_s: float
    gate_scan_limit: int
    native: bool
    # The fetch-protocol reader first, the librdkafka one (native) or confluent-kafka for the rest.
    fetch: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        # Spark hands options over with lower-cased names (CaseInsensitiveDict).
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        for name, why in _UNSUPPORTED.items():
            if name in lowered:
                raise SourceOptionError(name, lowered[name], f"not supported; {why}")
        bootstrap = lowered.get("kafka.bootstrap.servers", "").strip()
        if not bootstrap:
            raise SourceOptionError("kafka.bootstrap.servers", lowered.get(
                "kafka.bootstrap.servers"), "required: the Kafka brokers to read from")
        raw_topics = lowered.get("subscribe")
        topics = tuple(dict.fromkeys(t.strip() for t in (raw_topics or "").split(",")
                                     if t.strip()))
        if not topics:
            raise SourceOptionError("subscribe", raw_topics,
                                    "required: a comma-separated list of topics")
        overrides: dict[str, str] = {}
        for name, value in lowered.items():
            if not name.startswith("kafka.") or name == "kafka.bootstrap.servers":
                continue
            client_name = name[len("kafka."):]
            if client_name in _FORBIDDEN_CLIENT:
                raise SourceOptionError(name, value, f"not allowed: "
                                        f"{_FORBIDDEN_CLIENT[client_name]}")
            overrides[client_name] = value
        poll_ms = _positive_int(lowered, "kafkaConsumer.pollTimeoutMs") or 120_000
        reader = lowered.get("redrive.reader", "auto").strip().lower()
        if reader not in READERS:
            raise SourceOptionError("redrive.reader", lowered["redrive.reader"],
                                    "expected " + ", ".join(READERS[:-1]) + " or python")
        if reader == "native" and not native_reader_built():
            raise SourceOptionError("redrive.reader", reader, NATIVE_MISSING)
        if reader == "fetch" and not fetch_reader_built():
            raise SourceOptionError("redrive.reader", reader, FETCH_MISSING)
        fetch_unsupported = _fetch_unsupported(overrides)
        if reader == "fetch" and fetch_unsupported:
            raise SourceOptionError("redrive.reader", reader, fetch_unsupported)
        return cls(
            bootstrap=bootstrap,
            topics=topics,
            starting=_offsets_spec(lowered, "startingOffsets", topics),
            ending=_offsets_spec(lowered, "endingOffsets", topics),
            max_offsets_per_trigger=_positive_int(lowered, "maxOffsetsPerTrigger"),
            include_headers=_flag(lowered, "includeHeaders", False),
            client_overrides=overrides,
            gate=_flag(lowered, "redrive.gate", True),
            gated_topics=_gated_topics(lowered),
            group=(lowered.get("redrive.group") or "").strip() or None,
            fail_on_data_loss=_flag(lowered, "failOnDataLoss", True),
            poll_timeout_s=poll_ms / 1000.0,
            gate_scan_limit=_positive_int(lowered, "redrive.gate.scanLimit") or 200_000,
            native=reader == "native" or (reader in ("auto", "fetch") and native_reader_built()),
            fetch=reader == "fetch" or (reader == "auto" and fetch_reader_built()
                                        and not fetch_unsupported),
        )

    def gated(self, topic: str) -> bool:
        if not self.gate:
            return False
        if self.gated_topics is None:
            return True
        return any(topic == p.pattern or p.fullmatch(topic) for p in self.gated_topics)

    def consumer(self, group_id: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> Consumer:
        return kafka.consumer(self.bootstrap, group_id, {**self.client_overrides, **(extra or {})})

    @property
    def read_committed(self) -> bool:
        config = kafka.consumer_config(self.bootstrap, None, self.client_overrides)
        return str(config.get("isolation.level", "")).lower() != "read_uncommitted"


# --- offsets -------------------------------------------------------------------------------


def _ordered(offsets: Mapping[TopicPartitionKey, int]) -> list[tuple[TopicPartitionKey, int]]:
    return sorted(offsets.items(), key=lambda item: item[0])


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark checkpoints them. Key order is fixed (topic, then partition number)
    because Spark compares offsets as JSON text: a reordering would look like new data."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in _ordered(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(data: Mapping[str, Any] | None) -> Offsets:
    offsets: Offsets = {}
    for topic, partitions in (data or {}).items():
        for partition, offset in partitions.items():
            offsets[(topic, int(partition))] = int(offset)
    return offsets


def rate_limit(start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int],
               max_rows: int) -> Offsets:
    """Ends that admit at most `max_rows` records in all, shared in proportion to each partition's
    backlog (as Spark's Kafka source does), but never more than the limit in total."""
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * size / total for tp, size in backlog.items()}
    granted = {tp: int(share) for tp, share in shares.items()}
    left = max_rows - sum(granted.values())
    for tp in sorted(shares, key=lambda tp: (granted[tp] - shares[tp], tp))[:left]:
        granted[tp] += 1
    return {tp: start[tp] + granted[tp] for tp in latest}


# --- driver side ---------------------------------------------------------------------------


@dataclass
class _Scan:
    """What the driver knows of a gated partition: every record in [start, clear_to) is due;
    if held_due is set, the record at clear_to is not due before that time."""

    start: int
    clear_to: int
    held_due: int | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _offset(message: Message) -> int:
    offset = message.offset()
    # Only records produced locally lack an offset; consumed ones and EOF events carry one.
    return -1 if offset is None else offset


def _due(message: Message) -> int | None:
    raw = message.headers()
    if not raw or isinstance(raw, dict):
        return None
    return gate.due_of(h.normalize(raw))


class _Broker:
    """The driver's long-lived clients: metadata and offsets, the gate scan, group commits.

    Lives in the Python process that serves the streaming source; never pickled."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: kafka.Admin | None = None
        self._scanner: Consumer | None = None
        self._committer: Consumer | None = None

    def close(self) -> None:
        for client in (self._scanner, self._committer):
            if client is not None:
                client.close()
        self._scanner = self._committer = self._admin = None

    @property
    def admin(self) -> kafka.Admin:
        if self._admin is None:
            self._admin = kafka.admin(self.options.bootstrap, self.options.client_overrides)
        return self._admin

    def partitions(self, *, require_all: bool) -> list[TopicPartitionKey]:
        """The subscribed topics' partitions; with require_all, a missing topic is an error."""
        counts = kafka.topic_partitions(self.admin)
        missing = [t for t in self.options.topics if t not in counts]
        if missing and require_all:
            raise SourceOptionError("subscribe", ",".join(self.options.topics),
                                    f"topic {missing[0]!r} does not exist at "
                                    f"bootstrap.servers={self.options.bootstrap!r}")
        for topic in missing:
            log.warning("subscribed topic %r no longer exists; its offsets are kept", topic)
        return [(t, p) for t in self.options.topics if t in counts for p in range(counts[t])]

    def list_offsets(self, tps: Sequence[TopicPartitionKey], which: str) -> Offsets:
        """Earliest or latest offsets; latest is the last stable offset under read_committed,
        so a range never waits for a transaction that is still open."""
        if not tps:
            return {}
        spec = (OffsetSpec.earliest() if which == "earliest"  # type: ignore[no-untyped-call]
                else OffsetSpec.latest())  # type: ignore[no-untyped-call]
        isolation = (IsolationLevel.READ_COMMITTED if self.options.read_committed
                     else IsolationLevel.READ_UNCOMMITTED)
        try:
            futures = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in tps},
                                              isolation_level=isolation, request_timeout=30)
            return {(tp.topic, tp.partition): int(future.result().offset)
                    for tp, future in futures.items()}
        except KafkaException as exc:
            raise BrokerUnavailable(self.options.bootstrap,
                                    f"listing {which} offsets failed: {exc.args[0]}") from exc

    def resolve(self, spec: OffsetsSpec, tps: Sequence[TopicPartitionKey],
                option: str) -> Offsets:
        """Turn earliest/latest/JSON into offsets for exactly the given partitions."""
        if isinstance(spec, str):
            return self.list_offsets(tps, spec)
        missing = [tp for tp in tps if tp not in spec]
        unknown = [tp for tp in spec if tp not in tps]
        if missing or unknown:
            tp, why = ((missing[0], "is not given; name every partition of the subscribed topics")
                       if missing else (unknown[0], "does not exist"))
            raise SourceOptionError(option, json.dumps(offsets_to_json(spec)),
                                    f"partition {tp[0]}[{tp[1]}] {why}")
        earliest = self.list_offsets([tp for tp in tps if spec[tp] == EARLIEST], "earliest")
        latest = self.list_offsets([tp for tp in tps if spec[tp] == LATEST], "latest")
        return {tp: earliest.get(tp, latest.get(tp, spec[tp])) for tp in tps}

    def scan(self, tp: TopicPartitionKey, scan: _Scan, target: int, now_ms: int) -> None:
        """Advance `scan` towards `target` until a record is not yet due or the scan limit is
        reached. Control records and aborted records move the position without being seen."""
        if self._scanner is None:
            self._scanner = self.options.consumer(extra=kafka.RANGE_READ_DEFAULTS)
        consumer = self._scanner
        topic, partition = tp
        consumer.assign([TopicPartition(topic, partition, scan.clear_to)])
        budget = self.options.gate_scan_limit
        idle_until = time.monotonic() + self.options.poll_timeout_s
        while scan.clear_to < target and budget > 0:
            # consume() waits until it has num_messages or the timeout passed: never ask for
            # more than the range can hold.
            wanted = min(CONSUME_BATCH, budget, target - scan.clear_to)
            messages = consumer.consume(num_messages=wanted, timeout=POLL_S)
            offsets: list[int] = []
            dues: list[int | None] = []
            reached = scan.clear_to
            reset = False
            for message in messages:
                err = message.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        reached = max(reached, _offset(message))
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        reset = True
                        continue
                    if err.retriable():
                        continue
                    raise KafkaReadFailed(topic, partition, scan.clear_to, target, err.str())
                if _offset(message) >= target:
                    reached = max(reached, target)
                    break
                offsets.append(_offset(message))
                dues.append(_due(message))
            admission = gate.admit(dues, now_ms)
            budget -= admission.count
            if admission.held:
                scan.clear_to = offsets[admission.count]
                scan.held_due = admission.next_due_ms
                return
            if offsets:
                reached = max(reached, offsets[-1] + 1)
            if not messages:
                position = consumer.position([TopicPartition(topic, partition)])[0].offset
                reached = max(reached, position)
            progressed = reached > scan.clear_to
            if progressed:
                scan.clear_to = min(reached, target)
                idle_until = time.monotonic() + self.options.poll_timeout_s
            if reset:
                scan.clear_to = _resume_after_reset(consumer, topic, partition, scan.clear_to,
                                                    target, not self.options.fail_on_data_loss)
            elif not progressed and time.monotonic() > idle_until:
                raise KafkaReadFailed(topic, partition, scan.clear_to, target,
                                      f"no progress for {self.options.poll_timeout_s}s "
                                      "(kafkaConsumer.pollTimeoutMs)")

    def commit_group(self, offsets: Offsets) -> bool:
        """Mirror the query's progress into redrive.group so lag tools see it. The checkpoint
        stays the source of truth, so a failed commit is reported and not fatal."""
        group = self.options.group
        if group is None or not offsets:
            return False
        try:
            if self._committer is None:
                self._committer = self.options.consumer(group)
            self._committer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in
                                            _ordered(offsets)], asynchronous=False)
        except KafkaException as exc:
            log.warning("committing offsets to group %r failed: %s", group, exc.args[0])
            return False
        return True


# --- executor side -------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One Spark task: offsets [start, end) of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


def _size(items: list[bytes | None]) -> int:
    """Bytes held by `items`, None counting as nothing."""
    try:
        return sum(map(len, cast("list[bytes]", items)))
    except TypeError:
        return sum(len(item) for item in items if item is not None)


@dataclass
class _Columns:
    """Column builders for one Arrow batch; the Arrow types come from Spark's own conversion of
    the schema, so batches match what Spark expects exactly. Columns are filled a consumed batch
    at a time with map over Message's methods: per-record Python work is most of the read cost,
    so each field is fetched by one C-level call per record and nothing else."""

    topic: str
    partition: int
    include_headers: bool
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    # (type, ms) of each record, flattened: type, ms, type, ms, ...
    stamps: list[int] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)
    nbytes: int = 0

    def add(self, messages: Sequence[Message], offsets: Sequence[int]) -> None:
        keys = list(map(Message.key, messages))
        values = list(map(Message.value, messages))
        self.keys += keys
        self.values += values
        self.offsets += offsets
        self.stamps += chain.from_iterable(map(Message.timestamp, messages))
        if self.include_headers:
            self.headers += [m.headers() or None for m in messages]
        self.nbytes += _size(keys) + _size(values)

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        n = len(self.offsets)
        # Kafka's TimestampType ids as Spark shows them (-1 none, 0 create, 1 log append) are
        # librdkafka's minus one; times are ms, Spark's are us.
        kinds = pa.array(self.stamps[0::2], pa.int32())
        millis = pa.array(self.stamps[1::2], pa.int64())
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(schema.field("timestamp").type),
            pc.subtract(kinds, 1),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, schema.field("headers").type))
        for column in (self.keys, self.values, self.offsets, self.stamps, self.headers):
            column.clear()
        self.nbytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _position_after_errors(messages: Sequence[Message], position: int,
                           part: KafkaRange) -> tuple[int, bool]:
    """Account for the events among consumed messages: an end-of-partition event carries the
    position reached; transient errors are retried by librdkafka; an offset reset is returned
    for the caller to resume from (see _resume_after_reset); anything else is fatal."""
    reset = False
    for message in messages:
        err = message.error()
        if err is None:
            continue
        if err.code() == KafkaError._PARTITION_EOF:
            position = max(position, _offset(message))
        elif err.code() == KafkaError._AUTO_OFFSET_RESET:
            reset = True
        elif not err.retriable():
            raise KafkaReadFailed(part.topic, part.partition, part.start, part.end, err.str())
    return position, reset


def _resume_after_reset(consumer: Consumer, topic: str, partition: int, position: int,
                        end: int, skip_lost: bool) -> int:
    """The broker answered a fetch at `position` with "offset out of range". If it still holds
    that offset (some brokers say so for a moment), read on from it; if the records are gone
    (deleted, or past retention), fail naming them, or with skip_lost (failOnDataLoss=false)
    read on from the first offset left. Returns the position. Same rule as the C reader's."""
    low, _ = kafka.watermarks(consumer, topic, partition)
    if position < low and not skip_lost:
        raise KafkaReadFailed(topic, partition, position, end,
                              f"offsets {position} to {low - 1} are gone from the broker "
                              "(deleted or past retention)")
    if position < low:
        log.warning("%s[%d]: offsets %d to %d are gone from the broker; skipped "
                    "(failOnDataLoss=false)", topic, partition, position, low - 1)
        position = min(low, end)
    consumer.assign([TopicPartition(topic, partition, position)])
    return position


def _fetch_unsupported(overrides: Mapping[str, str]) -> str | None:
    """Why the fetch reader cannot serve these client settings, or None: it speaks plaintext
    only, does not check record CRCs, and fetches from leaders, not from a rack's follower."""
    protocol = overrides.get("security.protocol", "plaintext").strip().lower()
    if protocol != "plaintext":
        return f"kafka.security.protocol={protocol}: the fetch reader speaks plaintext only"
    if overrides.get("check.crcs", "false").strip().lower() in ("true", "1"):
        return "kafka.check.crcs=true: the fetch reader does not check CRCs"
    if overrides.get("client.rack", "").strip():
        return "kafka.client.rack: the fetch reader reads from leaders only"
    return None


def fetch_reader_built() -> bool:
    """Whether redrive._fetchread, the fetch-protocol reader, was built and loads."""
    return _loads("redrive._fetchread")


def native_reader_built() -> bool:
    """Whether redrive._rangeread, the C range reader over librdkafka, was built and loads."""
    return _loads("redrive._rangeread")


def _loads(extension: str) -> bool:
    """Whether an optional C extension of redrive was built and loads."""
    try:
        importlib.import_module(extension)
    except ImportError:
        return False
    return True


def read_range(options: SourceOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Read exactly [start, end) of one partition as Arrow batches.

    The loop ends when the position reaches `end`, not when offset end-1 was seen: under
    read_committed the last offsets of a range may be transaction markers or aborted records,
    which are never delivered. Both C readers follow the same rules as the confluent-kafka loop
    below, without a Python object per record: redrive._fetchread (Kafka's fetch protocol, for
    what it handles) and redrive._rangeread (librdkafka, for the rest).
    """
    schema = to_arrow_schema(kafka_schema(options.include_headers), timezone="UTC")
    if options.fetch:
        return _read_fetch(options, part, schema)
    return _read_client(options, part, schema)


def _read_client(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range through a Kafka client library: librdkafka from C, or confluent-kafka."""
    if options.native:
        return _read_native(options, part, schema)
    return _read_python(options, part, schema)


def _read_fetch(options: SourceOptions, part: KafkaRange,
                schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range through redrive._fetchread, which speaks Kafka's fetch protocol itself; what it
    hands back (a compressed batch, a partition error, a broker it cannot reach) is read by the
    client library from the offset it reached, by the same rules as any other read."""
    from redrive._fetchread import FetchReader, ReadError
    from redrive.spark import native_range

    reader = FetchReader(options.bootstrap, part.topic, part.partition, part.start, part.end,
                         options.include_headers, options.read_committed,
                         max(1, round(options.poll_timeout_s * 1000)),
                         options.client_overrides.get("client.id", "redrive"))
    try:
        yield from native_range.batches(reader, part.topic, part.partition, schema,
                                        max_rows=ARROW_BATCH_ROWS, max_bytes=ARROW_BATCH_BYTES)
    except ReadError as exc:
        raise KafkaReadFailed(part.topic, part.partition, part.start, part.end,
                              str(exc)) from None
    finally:
        reader.close()
    if reader.handoff is None or reader.position >= part.end:
        return
    log.info("%s[%d]: offsets %d to %d read by the client library: %s", part.topic,
             part.partition, reader.position, part.end - 1, reader.handoff)
    yield from _read_client(options, KafkaRange(part.topic, part.partition, reader.position,
                                                part.end), schema)


def _read_native(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    from redrive._rangeread import ReadError, librdkafka_version
    from redrive.spark import native_range

    try:
        try:
            reader = kafka.range_reader(options.bootstrap, part.topic, part.partition,
                                        part.start, part.end,
                                        include_headers=options.include_headers,
                                        poll_timeout_s=options.poll_timeout_s,
                                        skip_lost=not options.fail_on_data_loss,
                                        overrides=options.client_overrides)
        except ValueError as exc:
            # The system's librdkafka may be older than confluent-kafka's own.
            raise SourceOptionError("kafka.*", str(exc), (
                f"rejected by librdkafka {librdkafka_version()}, which the native reader "
                "links; redrive.reader=python reads through confluent-kafka")) from None
        try:
            yield from native_range.batches(reader, part.topic, part.partition, schema,
                                            max_rows=ARROW_BATCH_ROWS,
                                            max_bytes=ARROW_BATCH_BYTES)
        finally:
            reader.close()
    except ReadError as exc:
        raise KafkaReadFailed(part.topic, part.partition, part.start, part.end,
                              str(exc)) from None


def _read_python(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    errors = _LastClientError()
    consumer = options.consumer(extra={**kafka.RANGE_READ_DEFAULTS, "error_cb": errors})
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        columns = _Columns(part.topic, part.partition, options.include_headers)
        position = part.start
        idle_until = time.monotonic() + options.poll_timeout_s
        while position < part.end:
            with collector.paused():
                position, idle_until = _consume_into(consumer, columns, part, position,
                                                     idle_until, options, errors)
                full = (len(columns) >= ARROW_BATCH_ROWS
                        or columns.nbytes >= ARROW_BATCH_BYTES)
                ready = columns.batch(schema) if full else None
            if ready is not None:
                yield ready
        if len(columns):
            with collector.paused():
                ready = columns.batch(schema)
            yield ready
    finally:
        consumer.close()


class _LastClientError:
    """The consumer's error_cb: keeps the client's last error report (a broker it cannot reach,
    say) for the error of a read that makes no progress."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, error: KafkaError) -> None:
        self.text = error.str()

    def suffix(self) -> str:
        return f"; the client's last error: {self.text}" if self.text else ""


def _consume_into(consumer: Consumer, columns: _Columns, part: KafkaRange, position: int,
                  idle_until: float, options: SourceOptions,
                  errors: _LastClientError) -> tuple[int, float]:
    """One consume() call: its records of [position, end) into `columns`. Returns the new
    position and the time until which the read may go on without progress."""
    # consume() waits until it has num_messages or the timeout passed: never ask for more than
    # the range can hold.
    wanted = min(CONSUME_BATCH, part.end - position)
    messages = consumer.consume(num_messages=wanted, timeout=POLL_S)
    before = position
    records = messages
    reset = False
    if any(map(Message.error, messages)):
        records = [m for m in messages if m.error() is None]
        position, reset = _position_after_errors(messages, position, part)
    if records:
        # Consumed records of one partition come in offset order.
        offsets = cast("list[int]", list(map(Message.offset, records)))
        keep = bisect.bisect_left(offsets, part.end)
        if keep < len(records):
            records, offsets, position = records[:keep], offsets[:keep], part.end
        if records:
            columns.add(records, offsets)
            position = max(position, offsets[-1] + 1)
    elif not messages:
        tp = TopicPartition(part.topic, part.partition)
        position = max(position, consumer.position([tp])[0].offset)
    if reset and position < part.end:
        position = _resume_after_reset(consumer, part.topic, part.partition, position,
                                       part.end, not options.fail_on_data_loss)
    if position > before:
        idle_until = time.monotonic() + options.poll_timeout_s
    elif time.monotonic() > idle_until:
        raise KafkaReadFailed(part.topic, part.partition, part.start, part.end,
                              f"stuck at offset {position} for "
                              f"{options.poll_timeout_s}s (kafkaConsumer.pollTimeoutMs)"
                              + errors.suffix())
    return position, idle_until


def _ranges(start: Mapping[TopicPartitionKey, int],
            end: Mapping[TopicPartitionKey, int]) -> list[KafkaRange]:
    return [KafkaRange(t, p, start[(t, p)], stop) for (t, p), stop in _ordered(end)
            if (t, p) in start and stop > start[(t, p)]]


def _as_range(partition: InputPartition) -> KafkaRange:
    if not isinstance(partition, KafkaRange):
        raise TypeError(f"redrive-kafka cannot read {partition!r}: not a KafkaRange")
    return partition


def _check_schema(schema: StructType, include_headers: bool) -> None:
    expected = kafka_schema(include_headers)
    if schema != expected:
        raise SourceOptionError("schema", schema.simpleString(),
                                f"redrive-kafka has a fixed schema: {expected.simpleString()}")


# --- Spark interfaces ----------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (with the due gate) and reads them on executors."""

    def __init__(self, options: SourceOptions) -> None:
        if options.ending is not None:
            raise SourceOptionError("endingOffsets", options.ending,
                                    "only batch queries accept endingOffsets")
        self.options = options
        self._broker: _Broker | None = None
        self._scans: dict[TopicPartitionKey, _Scan] = {}
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        self._committed: Offsets | None = None
        self._initial: dict[str, dict[str, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy for read(): clients and planning state stay on the driver.
        return {"options": self.options, "_broker": None, "_scans": {}, "_target": None,
                "_latest": None, "_committed": None, "_initial": None}

    @property
    def broker(self) -> _Broker:
        if self._broker is None:
            self._broker = _Broker(self.options)
        return self._broker

    def initialOffset(self) -> dict[str, dict[str, int]]:
        # Spark asks again when it runs the first batch; "latest" must not move in between, or
        # the records produced meanwhile would fall outside both batches.
        if self._initial is None:
            tps = self.broker.partitions(require_all=True)
            start = self.broker.resolve(self.options.starting or "latest", tps,
                                        "startingOffsets")
            self._initial = offsets_to_json(start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.broker.partitions(require_all=True)
        self._target = self.broker.list_offsets(tps, "latest")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = offsets_from_json(start)
        # Spark plans the next batch only once the previous one is done, so `start` is
        # processed. It calls commit(end) only when planning the batch after that, which never
        # comes for the last batch of an availableNow run or before a stop.
        self._commit_group(begin)
        broker = self.broker
        tps = broker.partitions(require_all=False)
        latest = broker.list_offsets(tps, "latest")
        earliest = broker.list_offsets(tps, "earliest")
        self._latest = latest
        subscribed = set(self.options.topics)
        end: Offsets = {tp: offset for tp, offset in begin.items()
                        if tp[0] in subscribed and tp not in latest}
        # A partition that appeared since the last batch enters the offsets at its earliest
        # offset first, so every batch's start is a recorded value and replays read the same.
        for tp in tps:
            if tp not in begin:
                end[tp] = earliest[tp]
        known = {tp: begin[tp] for tp in tps if tp in begin}
        ceiling: Offsets = {}
        for tp, offset in known.items():
            top = latest[tp]
            if self._target is not None:
                top = min(top, self._target.get(tp, offset))
            if top < offset or offset < earliest[tp]:
                self._on_data_loss(tp, offset, earliest[tp], latest[tp])
            ceiling[tp] = max(top, offset)
        if isinstance(limit, ReadMaxRows):
            ceiling = rate_limit(known, ceiling, limit.max_rows)
        now_ms = _now_ms()
        for tp, offset in known.items():
            stop = ceiling[tp]
            if stop > offset and self.options.gated(tp[0]):
                stop = self._gate(tp, offset, stop, now_ms)
            end[tp] = stop
        return offsets_to_json(end)

    def _on_data_loss(self, tp: TopicPartitionKey, offset: int, earliest: int,
                      latest: int) -> None:
        why = (f"the next offset to read is {offset} but the partition now holds "
               f"[{earliest}, {latest})")
        if self.options.fail_on_data_loss:
            raise DataLoss(tp[0], tp[1], why)
        log.warning("data loss on %s[%d]: %s", tp[0], tp[1], why)

    def _gate(self, tp: TopicPartitionKey, begin: int, stop: int, now_ms: int) -> int:
        scan = self._scans.get(tp)
        if scan is None or not scan.start <= begin <= scan.clear_to:
            scan = _Scan(begin, begin)
        scan.start = begin
        self._scans[tp] = scan
        if scan.held_due is not None:
            if scan.held_due > now_ms:
                return min(scan.clear_to, stop)
            scan.clear_to += 1
            scan.held_due = None
        if scan.clear_to < stop:
            self.broker.scan(tp, scan, stop, now_ms)
        return min(scan.clear_to, stop)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        return _ranges(offsets_from_json(start), offsets_from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, _as_range(partition))

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(offsets_from_json(end))

    def _commit_group(self, offsets: Offsets) -> None:
        if self.options.group is None or offsets == self._committed:
            return
        if self.broker.commit_group(offsets):
            self._committed = dict(offsets)

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None


class KafkaBatchReader(DataSourceReader):
    """Reads [startingOffsets, endingOffsets) once, without the gate."""

    def __init__(self, options: SourceOptions) -> None:
        if options.starting == "latest" or (isinstance(options.starting, dict)
                                            and LATEST in options.starting.values()):
            raise SourceOptionError("startingOffsets", options.starting,
                                    "a batch query cannot start at latest")
        if options.ending == "earliest" or (isinstance(options.ending, dict)
                                            and EARLIEST in options.ending.values()):
            raise SourceOptionError("endingOffsets", options.ending,
                                    "a batch query cannot end at earliest")
        self.options = options

    def partitions(self) -> list[KafkaRange]:
        broker = _Broker(self.options)
        try:
            tps = broker.partitions(require_all=True)
            start = broker.resolve(self.options.starting or "earliest", tps, "startingOffsets")
            end = broker.resolve(self.options.ending or "latest", tps, "endingOffsets")
        finally:
            broker.close()
        return _ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, _as_range(partition))


class RedriveKafkaSource(DataSource):
    """`spark.readStream.format("redrive-kafka")`: Spark's Kafka source plus the due gate."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _options(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def schema(self) -> StructType:
        return kafka_schema(self._options().include_headers)

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        options = self._options()
        _check_schema(schema, options.include_headers)
        return KafkaStreamReader(options)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        options = self._options()
        _check_schema(schema, options.include_headers)
        return KafkaBatchReader(options)


def register(spark: Any) -> None:
    """Make `format("redrive-kafka")` available in this SparkSession."""
    spark.dataSource.register(RedriveKafkaSource)
