"""The `redrive-kafka` source's options and schema, validated: every bad value is reported by
option name and value before anything is read.

The schema and the option names are those of Spark's built-in Kafka source where they apply
(`kafka.*` client settings, `subscribe`, `startingOffsets`, `endingOffsets`, their `*Timestamp`
and `*OffsetsByTimestamp` forms, `maxOffsetsPerTrigger`, `includeHeaders`, `failOnDataLoss`,
`kafkaConsumer.pollTimeoutMs`);
redrive's own start with `redrive.` (`redrive.group`, `redrive.gate`, `redrive.gatedTopics`,
`redrive.gate.scanLimit`, `redrive.reader`, `redrive.decodeHeaders`, `redrive.resumeTopics`).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer
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

from redrive import kafka
from redrive.errors import RedriveError
from redrive.kafka.records import PartitionKey
from redrive.spark.columns import REDRIVE_COLUMN, REDRIVE_TYPE

EARLIEST = -2  # in startingOffsets/endingOffsets JSON, as in Spark
LATEST = -1
# Kafka's offsets and timestamps are signed 64-bit: a larger value cannot reach the broker.
MAX_LONG = 2**63 - 1
NATIVE_MISSING = ("the native reader (redrive.spark._rangeread) is not built: install "
                  "librdkafka's development files (Debian: librdkafka-dev), then reinstall "
                  "redrive")
FETCH_MISSING = ("the fetch reader (redrive.spark._fetchread) is not built: it needs a C "
                 "compiler and Python's headers when redrive is installed")
READERS = ("auto", "fetch", "native", "python")


@dataclass(frozen=True)
class ByTimestamp:
    """Offsets found by time, as Spark's Kafka source reads its `*Timestamp` options: in each
    partition, the first record whose timestamp is at or after `at` (ms since the epoch), one
    time for every partition or one per partition."""

    option: str  # as the user named it, for errors
    raw: str
    at: int | dict[PartitionKey, int]
    # Where no record is that late: fail ("error") or take the partition's end ("latest").
    none_found: str = "latest"

    def time_of(self, tp: PartitionKey) -> int:
        return self.at if isinstance(self.at, int) else self.at[tp]


# "earliest", "latest", explicit offsets, or offsets by timestamp
OffsetsSpec = str | dict[PartitionKey, int] | ByTimestamp


class SourceOptionError(RedriveError, ValueError):
    """An option of the redrive-kafka source is missing or has a value it cannot use."""

    def __init__(self, option: str, value: object, why: str) -> None:
        self.option = option
        self.value = value
        super().__init__(f"redrive-kafka option {option}={value!r}: {why}")


# --- schema --------------------------------------------------------------------------------


HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))


def kafka_schema(include_headers: bool = False, decode_headers: bool = False) -> StructType:
    """The schema of Spark's built-in Kafka source (KafkaRecordToRowConverter), field for field;
    with `decode_headers`, then the `redrive` column (redrive.decodeHeaders)."""
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
    if decode_headers:
        fields.append(StructField(REDRIVE_COLUMN, REDRIVE_TYPE))
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
    # Spark's Kafka source takes these; ignoring them would plan otherwise than asked.
    "minpartitions": "each Kafka partition is read by one task",
    "maxrecordsperpartition": "each Kafka partition is read by one task",
    "minoffsetspertrigger": "a trigger reads what is there, up to maxOffsetsPerTrigger",
    "maxtriggerdelay": "a trigger reads what is there, up to maxOffsetsPerTrigger",
}
STRATEGY_OPTION = "startingOffsetsByTimestampStrategy"


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


def _start(options: Mapping[str, str], topics: Sequence[str]) -> OffsetsSpec | None:
    """Where a query starts; as in Spark, startingTimestamp comes before
    startingOffsetsByTimestamp, which comes before startingOffsets."""
    raw = options.get(STRATEGY_OPTION.lower(), "error")
    strategy = str(raw).strip().lower()
    if strategy not in ("error", "latest"):
        raise SourceOptionError(STRATEGY_OPTION, raw, "expected error or latest")
    return (_timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp", topics,
                        strategy)
            or _offsets_spec(options, "startingOffsets", topics))


def _end(options: Mapping[str, str], topics: Sequence[str]) -> OffsetsSpec | None:
    """Where a batch query ends; past the last record's time, at the partition's end."""
    return (_timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp", topics,
                        "latest")
            or _offsets_spec(options, "endingOffsets", topics))


def _timestamps(options: Mapping[str, str], one: str, each: str, topics: Sequence[str],
                none_found: str) -> ByTimestamp | None:
    raw = options.get(one.lower())
    if raw is not None:
        text = str(raw).strip()
        if not _digits(text):
            raise SourceOptionError(one, raw, "expected a timestamp in milliseconds since the "
                                    "epoch, such as 1764236400000")
        if int(text) > MAX_LONG:
            raise SourceOptionError(one, raw, f"a timestamp is at most {MAX_LONG}")
        return ByTimestamp(one, text, int(text), none_found)
    raw = options.get(each.lower())
    if raw is None:
        return None
    at = _per_partition(each, raw, topics, 'expected JSON such as {"topic": {"0": '
                        '1764236400000}}', _check_timestamp)
    return ByTimestamp(each, str(raw).strip(), at, none_found)


def _digits(text: str) -> bool:
    # str.isdigit() holds for digits int() refuses, such as superscripts.
    return text.isascii() and text.isdigit()


def _check_timestamp(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return "must be a timestamp in milliseconds since the epoch"
    if value > MAX_LONG:
        return f"is past the largest timestamp, {MAX_LONG}"
    return None


def _check_offset(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
        return "must be an offset, -2 (earliest) or -1 (latest)"
    if value > MAX_LONG:
        return f"is past the largest offset, {MAX_LONG}"
    return None


def _offsets_spec(options: Mapping[str, str], name: str,
                  topics: Sequence[str]) -> OffsetsSpec | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    return _per_partition(name, raw, topics, 'expected earliest, latest or JSON such as '
                          '{"topic": {"0": 23, "1": -2}}', _check_offset)


def _per_partition(name: str, raw: str, topics: Sequence[str], expected: str,
                   check: Callable[[object], str | None]) -> dict[PartitionKey, int]:
    """A JSON object of topic -> partition -> number, each number passing `check`."""
    try:
        parsed = json.loads(str(raw).strip())
    except json.JSONDecodeError:
        raise SourceOptionError(name, raw, expected) from None
    if not isinstance(parsed, dict):
        raise SourceOptionError(name, raw, expected)
    spec: dict[PartitionKey, int] = {}
    for topic, partitions in parsed.items():
        if topic not in topics:
            raise SourceOptionError(name, raw, f"topic {topic!r} is not in subscribe")
        if not isinstance(partitions, dict):
            raise SourceOptionError(name, raw, f"topic {topic!r}: expected an object of "
                                    "partition -> number")
        for partition, value in partitions.items():
            if not _digits(str(partition)):
                raise SourceOptionError(name, raw, f"topic {topic!r}: partition {partition!r} "
                                        "is not a non-negative integer")
            why = check(value)
            if why is not None:
                raise SourceOptionError(name, raw, f"{topic}[{partition}]: {value!r} {why}")
            spec[(topic, int(partition))] = value
    return spec


def _resume_topics(options: Mapping[str, str], topics: Sequence[str],
                   group: str | None) -> tuple[str, ...]:
    raw = options.get("redrive.resumetopics")
    if raw is None:
        return ()
    named = tuple(dict.fromkeys(t.strip() for t in str(raw).split(",") if t.strip()))
    if group is None:
        raise SourceOptionError("redrive.resumeTopics", raw,
                                "needs redrive.group: the topics start where that group stands")
    for topic in named:
        if topic not in topics:
            raise SourceOptionError("redrive.resumeTopics", raw,
                                    f"topic {topic!r} is not in subscribe")
    return named


def _check_not_resumed(options: Mapping[str, str], starting: OffsetsSpec | None,
                       resumed: Sequence[str]) -> None:
    """A start given per partition names the topics not resumed only: the resumed start where
    the group stands (planning would call their partitions unknown)."""
    spec: object = starting
    option, raw = "startingOffsets", options.get("startingoffsets")
    if isinstance(starting, ByTimestamp):
        spec, option, raw = starting.at, starting.option, starting.raw
    if not isinstance(spec, dict):
        return
    named = sorted({topic for topic, _ in spec if topic in resumed})
    if named:
        raise SourceOptionError(option, raw, f"topic {named[0]!r} is in redrive.resumeTopics, "
                                "which start where redrive.group stands: name the other "
                                "topics' partitions only")


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
    # The `redrive` column, decoded as each batch is read (spark.columns).
    decode_headers: bool = False
    # Topics a new checkpoint starts where `group` stands, whatever startingOffsets says.
    resume_topics: tuple[str, ...] = ()

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
        include_headers = _flag(lowered, "includeHeaders", False)
        decode_headers = _flag(lowered, "redrive.decodeHeaders", False)
        if decode_headers and not include_headers:
            raise SourceOptionError("redrive.decodeHeaders", lowered["redrive.decodeheaders"],
                                    "needs includeHeaders=true: the column is decoded from them")
        group = (lowered.get("redrive.group") or "").strip() or None
        resume_topics = _resume_topics(lowered, topics, group)
        fetch_unsupported = _fetch_unsupported(overrides)
        if reader == "fetch" and fetch_unsupported:
            raise SourceOptionError("redrive.reader", reader, fetch_unsupported)
        starting = _start(lowered, topics)
        _check_not_resumed(lowered, starting, resume_topics)
        return cls(
            bootstrap=bootstrap,
            topics=topics,
            starting=starting,
            ending=_end(lowered, topics),
            max_offsets_per_trigger=_positive_int(lowered, "maxOffsetsPerTrigger"),
            include_headers=include_headers,
            client_overrides=overrides,
            gate=_flag(lowered, "redrive.gate", True),
            gated_topics=_gated_topics(lowered),
            group=group,
            fail_on_data_loss=_flag(lowered, "failOnDataLoss", True),
            poll_timeout_s=poll_ms / 1000.0,
            gate_scan_limit=_positive_int(lowered, "redrive.gate.scanLimit") or 200_000,
            native=reader == "native" or (reader in ("auto", "fetch") and native_reader_built()),
            fetch=reader == "fetch" or (reader == "auto" and fetch_reader_built()
                                        and not fetch_unsupported),
            decode_headers=decode_headers,
            resume_topics=resume_topics,
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
    """Whether redrive.spark._fetchread, the fetch-protocol reader, was built and loads."""
    return _loads("redrive.spark._fetchread")


def native_reader_built() -> bool:
    """Whether redrive.spark._rangeread, the C range reader over librdkafka, was built and loads."""
    return _loads("redrive.spark._rangeread")


def _loads(extension: str) -> bool:
    """Whether an optional C extension of redrive was built and loads."""
    try:
        importlib.import_module(extension)
    except ImportError:
        return False
    return True
