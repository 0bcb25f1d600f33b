"""The stream source where a partition no longer holds the offset to read: a recreated or
truncated topic, or startingOffsets outside the partition (driver planning, no Spark jobs)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from redrive import kafka
from redrive.spark.options import SourceOptionError, SourceOptions
from redrive.spark.planning import DataLoss
from redrive.spark.readers import KafkaRange
from redrive.spark.source import KafkaStreamReader

from ..records import produce_input

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def produce(bootstrap: str, topic: str, count: int) -> None:
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"v%d" % i) for i in range(count)])


def reader(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", **extra}
    return KafkaStreamReader(SourceOptions.parse(options))


def recreate(bootstrap: str, topic: str, new_topic: Any) -> None:
    admin = kafka.admin(bootstrap)
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while topic in kafka.topic_partitions(admin):
        assert time.monotonic() < deadline, f"topic {topic} was not deleted"
        time.sleep(0.1)
    new_topic(1, name=topic)


def test_a_recreated_topic_is_read_from_its_earliest_offset(
        bootstrap: str, new_topic: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 50)
    source = reader(bootstrap, topic, failOnDataLoss="false")
    try:
        first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
        assert first == {topic: {"0": 50}}
        recreate(bootstrap, topic, new_topic)
        produce(bootstrap, topic, 30)
        with caplog.at_level(logging.WARNING):
            restarted = source.latestOffset(first, ReadAllAvailable())
        # An empty batch that ends where the new partition begins.
        assert restarted == {topic: {"0": 0}}
        assert source.partitions(first, restarted) == []
        assert "reading goes on from offset 0" in caplog.text
        produce(bootstrap, topic, 25)
        end = source.latestOffset(restarted, ReadAllAvailable())
        assert end == {topic: {"0": 55}}
        assert source.partitions(restarted, end) == [KafkaRange(topic, 0, 0, 55)]
    finally:
        source.stop()


def test_an_offset_past_the_end_goes_on_from_the_earliest_under_a_rate_limit(
        bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 30)
    admin = kafka.admin(bootstrap)
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(30)
    source = reader(bootstrap, topic, failOnDataLoss="false")
    try:
        assert source.latestOffset({topic: {"0": 100}}, ReadMaxRows(4)) == {topic: {"0": 20}}
        assert source.latestOffset({topic: {"0": 20}}, ReadMaxRows(4)) == {topic: {"0": 24}}
    finally:
        source.stop()
    strict = reader(bootstrap, topic)
    try:
        with pytest.raises(DataLoss, match="next offset to read is 100"):
            strict.latestOffset({topic: {"0": 100}}, ReadAllAvailable())
    finally:
        strict.stop()


def test_starting_offsets_past_the_end(bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 5)
    given = json.dumps({topic: {"0": 100}})
    strict = reader(bootstrap, topic, startingOffsets=given)
    try:
        with pytest.raises(SourceOptionError, match=r"startingOffsets=.*100.*\[0, 5\)"):
            strict.initialOffset()
    finally:
        strict.stop()
    source = reader(bootstrap, topic, startingOffsets=given, failOnDataLoss="false")
    try:
        start = source.initialOffset()
        assert start == {topic: {"0": 100}}
        restarted = source.latestOffset(start, ReadAllAvailable())
        assert restarted == {topic: {"0": 0}}
        produce(bootstrap, topic, 20)
        end = source.latestOffset(restarted, ReadAllAvailable())
        assert source.partitions(restarted, end) == [KafkaRange(topic, 0, 0, 25)]
    finally:
        source.stop()
