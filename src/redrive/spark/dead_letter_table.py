"""A group's dead-letter topic as a DataFrame, to look at failures with SQL.

`dead_letters(spark, connection, topic, group)` reads the topic with the redrive-kafka batch
source and decodes each record's story on the executors with the one reader of dead-letter
headers (`redrive.dead_letter_headers`), so the dead letters of the other systems it knows
(Spring Kafka, Kafka Connect, Kafka Streams, share groups, Karafka) get the same columns as
redrive's. A record whose redrive headers cannot be read
keeps its Kafka columns and says why in `problem`. Each action reads the topic as it is then.

Replaying a selection of the table is an on-call tool, so it lives in `redrive.ops.selection`:
a runtime room such as this one never imports `redrive.ops`. The `dlt_*` columns are what it
needs to find each record again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from redrive import headers as h
from redrive import kafka, topics
from redrive.dead_letter_headers import read_dead_letter
from redrive.errors import InvalidArgument, MalformedHeader, UnknownTopic
from redrive.spark.columns import unreadable_name
from redrive.spark.source import SOURCE_NAME, register

_STAMP = pa.timestamp("us", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# Where the record is: the dead-letter topic, and the main topic and group it belongs to (the
# group's first retry topic is planned from those two; splitting the topic's name would be
# ambiguous, since names may contain the separator).
COORDINATES = ("dlt_topic", "dlt_partition", "dlt_offset")
TABLE_TOPIC, TABLE_GROUP = "dlt_main_topic", "dlt_group"
_LOCATION = [
    ("dlt_topic", pa.string()), ("dlt_partition", pa.int32()), ("dlt_offset", pa.int64()),
    ("dlt_timestamp", _STAMP), (TABLE_TOPIC, pa.string()), (TABLE_GROUP, pa.string()),
    ("key", pa.binary()), ("value", pa.binary()), ("headers", _HEADERS),
]
# Its story, decoded from the headers.
_STORY = pa.schema([
    ("system", pa.string()), ("reason", pa.string()), ("error_type", pa.string()),
    ("error_message", pa.string()), ("error_trace", pa.string()), ("attempt", pa.int32()),
    ("group", pa.string()), ("original_topic", pa.string()), ("original_partition", pa.int32()),
    ("original_offset", pa.int64()), ("original_timestamp", _STAMP),
    ("first_failure", _STAMP), ("problem", pa.string()),
])
SCHEMA = pa.schema([*_LOCATION, *_STORY])


# What each numeric column holds. Other systems' headers are read leniently, so a number may lie
# outside its column (a Spring header of the wrong width, a partition past 32 bits): such a value
# becomes null and `problem` says why, rather than failing the whole read. Times go from the year
# 1 to the end of 9999, as a Python datetime holds them.
_MICROS = (-62_135_596_800_000_000, h.MAX_TIME_MS * 1000 + 999)
_RANGES = {
    "attempt": (-2**31, h.MAX_INT32), "original_partition": (-2**31, h.MAX_INT32),
    "original_offset": (-2**63, 2**63 - 1), "original_timestamp": _MICROS,
    "first_failure": _MICROS,
}


def _micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


def _in_range(out: dict[str, Any]) -> dict[str, Any]:
    problems = []
    for name, (low, high) in _RANGES.items():
        value = out.get(name)
        if value is not None and not low <= value <= high:
            out[name] = None
            shown = f"{value // 1000} ms" if high == _MICROS[1] else value
            problems.append(f"{name} {shown} is out of range")
    if problems:
        out["problem"] = "; ".join(problems)
    return out


def story(headers: list[tuple[str, bytes | None]]) -> dict[str, Any]:
    """The `_STORY` columns of one record (absent keys are null)."""
    out = _story(headers)
    # A dead letter a foreign producer wrote with a header name that is not UTF-8: its story is
    # read from the other headers, and `problem` says which it shows with U+FFFD.
    unreadable = unreadable_name(headers)
    if unreadable is not None:
        out["problem"] = "; ".join(filter(None, (str(unreadable), out.get("problem"))))
    return out


def _story(headers: list[tuple[str, bytes | None]]) -> dict[str, Any]:
    try:
        info = read_dead_letter(headers)
    except MalformedHeader as exc:
        return {"problem": str(exc)}
    if info is None:
        return {}
    out: dict[str, Any] = {
        "system": info.system, "reason": info.reason, "error_type": info.error_type,
        "error_message": info.error_message, "error_trace": info.error_trace,
        "attempt": info.attempts, "group": info.group,
    }
    if info.system == "redrive":
        # Only redrive's headers carry the first failure; read_dead_letter has validated them.
        out["first_failure"] = _micros(h.read_delivery(headers).first_failure_ms)
    if info.original is not None:
        origin = info.original
        out.update(original_topic=origin.topic, original_partition=origin.partition,
                   original_offset=origin.offset,
                   original_timestamp=_micros(origin.timestamp_ms))
    return _in_range(out)


@dataclass(frozen=True)
class DecodeDeadLetters:
    """The mapInArrow body. A module-level class holding plain values, so that Spark Connect
    ships it by reference to the server's Python."""

    main_topic: str
    group: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.decode(batch)

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = batch.num_rows
        stories = [story(h.normalize((pair["key"], pair["value"]) for pair in pairs or ()))
                   for pairs in batch.column("headers").to_pylist()]
        kept = {"dlt_topic": "topic", "dlt_partition": "partition", "dlt_offset": "offset",
                "dlt_timestamp": "timestamp", "key": "key", "value": "value",
                "headers": "headers"}
        constant = {TABLE_TOPIC: self.main_topic, TABLE_GROUP: self.group}
        columns = []
        for field in SCHEMA:
            if field.name in kept:
                # Cast: Spark names a list's item `element` and may hand a local time zone.
                columns.append(batch.column(kept[field.name]).cast(field.type))
            elif field.name in constant:
                columns.append(pa.array([constant[field.name]] * rows, field.type))
            else:
                columns.append(pa.array([s.get(field.name) for s in stories], field.type))
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def dead_letters(spark: Any, connection: kafka.Connection, topic: str, group: str) -> Any:
    """The dead-letter topic of `group` for main topic `topic`, one decoded row per record.

    `connection` is a bootstrap address or a librdkafka config. Raises UnknownTopic when the
    dead-letter topic does not exist (the group never dead-lettered, or a name is wrong)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if not hasattr(spark, "dataSource"):
        raise InvalidArgument("spark", spark, "must be a SparkSession (classic or Connect)")
    dlt = topics.dead_letter_name(topics.check_name("topic", topic),
                                  topics.check_name("group", group))
    if dlt not in kafka.topic_partitions(kafka.admin(connection)):
        raise UnknownTopic(dlt)
    register(spark)
    options = {f"kafka.{key}": str(value)
               for key, value in kafka.client_config(connection).items()}
    options.update({"subscribe": dlt, "startingOffsets": "earliest", "endingOffsets": "latest",
                    "includeHeaders": "true"})
    frame = spark.read.format(SOURCE_NAME).options(**options).load()
    return frame.mapInArrow(DecodeDeadLetters(topic, group), from_arrow_schema(SCHEMA))
