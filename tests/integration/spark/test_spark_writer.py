"""write_to_kafka on real Spark against the real test broker."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.spark import write_to_kafka

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROW_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
    StructField("partition", IntegerType()),
])


def read_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = kafka.consumer(bootstrap, overrides={"enable.partition.eof": False})
    consumer.subscribe([topic])
    messages: list[Any] = []
    try:
        for _ in range(60):
            messages += [m for m in consumer.consume(count, 0.5) if m.error() is None]
            if len(messages) >= count:
                break
    finally:
        consumer.close()
    return messages


def test_round_trip_keeps_headers_byte_for_byte(spark: Any, bootstrap: str,
                                                new_topic: Any) -> None:
    topic = new_topic(2)
    rows = [(None if i % 3 == 0 else f"k{i}".encode(), bytes([i % 256]) * (i + 1), None,
             [("bin", bytes(range(256))), ("empty", b""), ("bin", b"\x00\xff" * i)],
             i % 2)
            for i in range(200)]
    frame = spark.createDataFrame(rows, ROW_SCHEMA)
    assert write_to_kafka(frame, bootstrap, default_topic=topic) == 200
    messages = read_all(bootstrap, topic, 200)
    assert len(messages) == 200
    expected = {bytes(value): (key, headers, partition)
                for key, value, _, headers, partition in rows}
    for message in messages:
        key, headers, partition = expected[message.value()]
        assert message.key() == key
        assert kafka.message_headers(message) == headers
        assert message.partition() == partition


def test_a_null_header_value_stays_null(spark: Any, bootstrap: str, new_topic: Any) -> None:
    """As Kafka and Spark's own Kafka sink keep it: null and empty are two values."""
    topic = new_topic()
    frame = spark.createDataFrame(
        [(b"k", b"v", None, [("absent", None), ("empty", b""), ("x", b"1")], 0)], ROW_SCHEMA)
    assert write_to_kafka(frame, bootstrap, default_topic=topic) == 1
    [message] = read_all(bootstrap, topic, 1)
    assert message.headers() == [("absent", None), ("empty", b""), ("x", b"1")]


def test_an_override_that_would_leave_records_unacknowledged_is_refused_at_once(
        spark: Any, bootstrap: str) -> None:
    frame = spark.createDataFrame([(b"k", b"v", None, [], 0)], ROW_SCHEMA)
    # Named here on the driver, not by every task on the executors.
    with pytest.raises(InvalidArgument, match="acks"):
        write_to_kafka(frame, bootstrap, default_topic="never-written",
                       producer_overrides={"acks": 0})


def test_topic_column_and_text_values(spark: Any, bootstrap: str, new_topic: Any) -> None:
    first, second = new_topic(1), new_topic(1)
    frame = spark.createDataFrame([(first, "a"), (second, "b"), (first, "c")],
                                  "topic string, value string")
    assert write_to_kafka(frame, bootstrap) == 3
    assert sorted(m.value() for m in read_all(bootstrap, first, 2)) == [b"a", b"c"]
    assert [m.value() for m in read_all(bootstrap, second, 1)] == [b"b"]


def test_missing_topic_is_named(spark: Any, bootstrap: str) -> None:
    frame = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(ValueError, match="topic"):
        write_to_kafka(frame, bootstrap)


def test_undelivered_records_fail_the_task(spark: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    frame = spark.createDataFrame([(b"v",)] * 3, "value binary")
    with pytest.raises(Exception, match=r"DeliveryFailed|delivery to"):
        write_to_kafka(frame, f"127.0.0.1:{closed_port}", default_topic="nowhere",
                       producer_overrides={"message.timeout.ms": 2000}, timeout_s=5)
