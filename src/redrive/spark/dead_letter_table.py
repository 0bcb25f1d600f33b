"""A group's dead-letter topic as a DataFrame, to query failures with SQL, and replay of a
selection of it.

`dead_letters` reads the topic with the redrive-kafka batch source and decodes each record's
story on the executors with the one reader of dead-letter headers (redrive's own, Spring Kafka's,
Kafka Connect's, Kafka Streams'), so a Spring or Connect dead letter gets the same columns as a
redrive one. A record whose redrive headers cannot be read keeps its Kafka columns and says why
in `problem`. `replay` hands the selected records' coordinates to the replay of `redrive dlt
replay`, so a selection is replayed through the same idempotent, audited replay log.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from redrive import headers as h
from redrive import kafka, topics
from redrive.dead_letter_headers import read_dead_letter
from redrive.errors import InvalidArgument, MalformedHeader, UnknownTopic
from redrive.ops.deadletters import DeadLetterFilter
from redrive.ops.replay import TO_ORIGINAL, TO_RETRY, ReplayReport, first_retry_topic
from redrive.ops.replay import replay as replay_topic
from redrive.policy import RetryPolicy
from redrive.spark.source import SOURCE_NAME, register

_STAMP = pa.timestamp("us", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema([
    ("dlt_topic", pa.string()), ("dlt_partition", pa.int32()), ("dlt_offset", pa.int64()),
    ("dlt_timestamp", _STAMP),
    # Which group's dead-letter topic of which main topic: what replay to a retry topic needs.
    ("dlt_main_topic", pa.string()), ("dlt_group", pa.string()),
    ("key", pa.binary()), ("value", pa.binary()), ("headers", _HEADERS),
    ("system", pa.string()), ("reason", pa.string()), ("error_type", pa.string()),
    ("error_message", pa.string()), ("error_trace", pa.string()), ("attempt", pa.int32()),
    ("group", pa.string()), ("original_topic", pa.string()), ("original_partition", pa.int32()),
    ("original_offset", pa.int64()), ("original_timestamp", _STAMP),
    ("first_failure", _STAMP), ("problem", pa.string()),
])
COORDINATES = ("dlt_topic", "dlt_partition", "dlt_offset")


@dataclass(frozen=True)
class DecodeDeadLetters:
    """mapInArrow body: each dead-letter record's story in columns. A class at module level,
    so Spark Connect ships it by reference to the server's Python."""

    main_topic: str
    group: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [self._row(row) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=SCHEMA)

    def _row(self, row: dict[str, Any]) -> dict[str, Any]:
        pairs = [(pair["key"], bytes(pair["value"] or b"")) for pair in row["headers"] or ()]
        out: dict[str, Any] = {
            "dlt_topic": row["topic"], "dlt_partition": row["partition"],
            "dlt_offset": row["offset"], "dlt_timestamp": row["timestamp"],
            "dlt_main_topic": self.main_topic, "dlt_group": self.group,
            "key": row["key"], "value": row["value"], "headers": row["headers"],
        }
        try:
            info = read_dead_letter(pairs)
            first_failure = h.read_delivery(pairs).first_failure_ms if info and \
                info.system == "redrive" else None
        except MalformedHeader as exc:
            return {**out, "problem": str(exc)}
        if info is None:
            return out
        origin = info.original
        out.update({
            "system": info.system, "reason": info.reason, "error_type": info.error_type,
            "error_message": info.error_message, "error_trace": info.error_trace,
            "attempt": info.attempts, "group": info.group,
            "first_failure": _stamp(first_failure),
        })
        if origin is not None:
            out.update({"original_topic": origin.topic, "original_partition": origin.partition,
                        "original_offset": origin.offset,
                        "original_timestamp": _stamp(origin.timestamp_ms)})
        return out


def _stamp(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


def dead_letters(spark: Any, connection: kafka.Connection, topic: str, group: str) -> Any:
    """The dead-letter topic of `group` for main topic `topic`, one row per record, decoded.

    Raises UnknownTopic when the dead-letter topic does not exist (the group never
    dead-lettered, or the names are wrong)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    dlt = topics.dead_letter_name(topics.check_name("topic", topic),
                                  topics.check_name("group", group))
    if dlt not in kafka.topic_partitions(kafka.admin(connection)):
        raise UnknownTopic(dlt)
    register(spark)
    options = {f"kafka.{key}": str(value)
               for key, value in kafka.client_config(connection).items()}
    options.update({"subscribe": dlt, "startingOffsets": "earliest",
                    "endingOffsets": "latest", "includeHeaders": "true",
                    "redrive.gate": "false"})
    frame = spark.read.format(SOURCE_NAME).options(**options).load()
    return frame.mapInArrow(DecodeDeadLetters(topic, group), from_arrow_schema(SCHEMA))


def replay(selection: Any, connection: kafka.Connection, *, to: str = TO_ORIGINAL,
           policy: RetryPolicy | None = None, dry_run: bool = False,
           rate: str | float | None = None, actor: str | None = None,
           keep_attempts: bool = False) -> list[ReplayReport]:
    """Replay the dead letters a DataFrame of `dead_letters(...)` selects, one report per
    dead-letter topic, through `redrive dlt replay`'s replay log: a record replayed before is
    not copied again. to="original" sends each to the topic it first came from; to="retry" to
    the group's first retry topic under `policy`."""
    missing = [name for name in (*COORDINATES, "dlt_main_topic", "dlt_group")
               if name not in selection.columns]
    if missing:
        raise InvalidArgument("selection", missing[0],
                              "missing: select the rows from redrive.spark.dead_letters(...)")
    if to == TO_RETRY and policy is None:
        raise InvalidArgument("policy", None, "replay to a retry topic needs the group's policy")
    wanted: dict[tuple[str, str, str], set[tuple[int, int]]] = defaultdict(set)
    for row in selection.select(*COORDINATES, "dlt_main_topic", "dlt_group").distinct().collect():
        key = (row["dlt_topic"], row["dlt_main_topic"], row["dlt_group"])
        wanted[key].add((row["dlt_partition"], row["dlt_offset"]))
    reports = []
    for (dlt, main_topic, group), coordinates in sorted(wanted.items()):
        to_topic = first_retry_topic(policy, main_topic, group) \
            if to == TO_RETRY and policy is not None else None
        reports.append(replay_topic(
            connection, dlt, to=to, to_topic=to_topic, keep_attempts=keep_attempts,
            selection=DeadLetterFilter(coordinates=frozenset(coordinates)), dry_run=dry_run,
            rate=rate, actor=actor))
    return reports
