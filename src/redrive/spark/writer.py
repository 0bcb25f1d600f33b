"""Write a DataFrame to Kafka, with headers, and fail the Spark task unless every record is acked.

Columns, as for Spark's Kafka sink: `value` (binary or string, required), `key` (binary or
string), `topic` (string; else `default_topic`), `headers` (array<struct<key: string, value:
binary>>) and `partition` (int; null or negative lets the key decide). Other columns are ignored.

Each task produces its rows and waits for the broker's acknowledgement of all of them; if any
delivery failed or is still queued, the task raises, so Spark retries it or fails the batch
instead of marking it done with records lost. Retried tasks send their records again: delivery
is at least once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from redrive import kafka
from redrive.errors import RedriveError
from redrive.spark.producers import produce_cached


class WriterInputError(RedriveError, ValueError):
    """The DataFrame handed to the writer lacks a column or has one of the wrong type."""

    def __init__(self, column: str, value: object, why: str) -> None:
        self.column = column
        self.value = value
        super().__init__(f"cannot write to Kafka: column {column}={value!r}: {why}")


def _as_bytes(value: bytes | bytearray | str | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    # produce() rejects bytearray and memoryview.
    return bytes(value)


def _header_name(name: str | None) -> str:
    # Kafka has no header without a name: Java's client refuses it, and str() would write "None".
    if name is None:
        raise WriterInputError("headers", "key=None", "a header has a null key")
    return name


def _column(batch: pa.RecordBatch, name: str) -> list[Any]:
    if name in batch.schema.names:
        return list(batch.column(name).to_pylist())
    return [None] * batch.num_rows


def _records(batches: Iterator[pa.RecordBatch],
             default_topic: str | None) -> Iterator[kafka.OutRecord]:
    for batch in batches:
        values, keys = _column(batch, "value"), _column(batch, "key")
        topics, partitions = _column(batch, "topic"), _column(batch, "partition")
        header_lists = _column(batch, "headers")
        for i in range(batch.num_rows):
            topic = topics[i] or default_topic
            if not topic:
                raise WriterInputError("topic", topics[i],
                                       "a row has no topic and no default_topic was given")
            # A null value stays null, as Kafka and Spark's own Kafka sink keep it.
            headers = [(_header_name(entry["key"]), _as_bytes(entry["value"]))
                       for entry in header_lists[i] or ()]
            yield kafka.OutRecord(topic=topic, value=_as_bytes(values[i]),
                                  key=_as_bytes(keys[i]), headers=headers,
                                  partition=partitions[i])


@dataclass(frozen=True)
class _PartitionWriter:
    """The function mapInArrow runs per task. A class at module level is pickled by reference,
    so executors use their process's producer cache (redrive.spark.producers), not a copy."""

    connection: kafka.Connection
    overrides: Mapping[str, Any]
    default_topic: str | None
    timeout_s: float

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        delivered = produce_cached(self.connection, _records(batches, self.default_topic),
                                   self.timeout_s, self.overrides)
        yield pa.RecordBatch.from_arrays([pa.array([delivered], pa.int64())],
                                         names=["delivered"])


_BYTES_OR_TEXT = (BinaryType, StringType)


def _check_type(df: DataFrame, name: str, allowed: tuple[type[DataType], ...],
                required: bool = False) -> bool:
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name not in fields:
        if required:
            raise WriterInputError(name, None, "missing")
        return False
    if not isinstance(fields[name], allowed):
        raise WriterInputError(name, fields[name].simpleString(), "expected " + " or ".join(
            t.typeName() for t in allowed))
    return True


def _check_headers(df: DataFrame) -> bool:
    if not _check_type(df, "headers", (ArrayType,)):
        return False
    headers_type = df.schema["headers"].dataType
    element = headers_type.elementType if isinstance(headers_type, ArrayType) else None
    ok = (isinstance(element, StructType) and element.fieldNames() == ["key", "value"]
          and isinstance(element["key"].dataType, StringType)
          and isinstance(element["value"].dataType, _BYTES_OR_TEXT))
    if not ok:
        raise WriterInputError("headers", headers_type.simpleString(),
                               "expected array<struct<key:string,value:binary>>")
    return True


def write_to_kafka(df: DataFrame, connection: kafka.Connection, default_topic: str | None = None,
                   *, producer_overrides: Mapping[str, Any] | None = None,
                   timeout_s: float = 30.0) -> int:
    """Produce every row of `df` to Kafka and return how many records the broker acknowledged.

    `connection` is a bootstrap address or a librdkafka config mapping. Raises (through Spark) if
    any record was not acknowledged within `timeout_s` per task. Usable from foreachBatch; persist
    the batch DataFrame first if it is used for more than this write.
    """
    # A missing bootstrap address or a refused override (acks 0: nothing would be acknowledged)
    # fails here, not in every task on the executors.
    kafka.producer_config(connection, overrides=producer_overrides)
    columns = ["value"]
    _check_type(df, "value", _BYTES_OR_TEXT, required=True)
    if _check_type(df, "key", _BYTES_OR_TEXT):
        columns.append("key")
    if _check_type(df, "topic", (StringType,)):
        columns.append("topic")
    elif default_topic is None:
        raise WriterInputError("topic", None, "missing, and no default_topic was given")
    if _check_type(df, "partition", (IntegerType, ShortType, LongType)):
        columns.append("partition")
    if _check_headers(df):
        columns.append("headers")
    writer = _PartitionWriter(connection if isinstance(connection, str) else dict(connection),
                              dict(producer_overrides or {}), default_topic, timeout_s)
    rows = df.select(*columns).mapInArrow(writer, "delivered long").collect()
    return sum(int(row["delivered"]) for row in rows)
