"""The redrive-kafka source on real Spark (session fixture) against the real test broker."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.cimpl import NewPartitions
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
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

from redrive import headers, kafka
from redrive.errors import BrokerUnavailable
from redrive.spark import source
from redrive.spark.options import SourceOptions
from redrive.spark.planning import offsets_to_json, rate_limit
from redrive.spark.source import KafkaStreamReader

from ..records import input_producer, produce_input
from .conftest import produce_transactions

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Spark's own Kafka source schema (KafkaRecordToRowConverter), written out field by field.
SPARK_KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
])
SPARK_KAFKA_HEADERS = StructField("headers", ArrayType(StructType([
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), True),
]), True), True)


def produce(bootstrap: str, topic: str, count: int, *, partition: int | None = None,
            start: int = 0, header_list: list[tuple[str, bytes]] | None = None) -> None:
    records = [kafka.OutRecord(topic, f"v{start + i}".encode(), f"k{start + i}".encode(),
                               headers=header_list or [], partition=partition)
               for i in range(count)]
    produce_input(bootstrap, records)


@dataclass
class Seen:
    batch: int
    started_ms: int
    topic: str
    partition: int
    offset: int
    value: bytes
    headers: list[tuple[str, bytes]]


class Collector:
    """foreachBatch target: remembers each row with the driver time at the batch's start."""

    def __init__(self) -> None:
        self.rows: list[Seen] = []
        self.batch_sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        started_ms = int(time.time() * 1000)
        has_headers = "headers" in frame.columns
        rows = frame.collect()
        with self.lock:
            self.batch_sizes.append(len(rows))
            for row in rows:
                pairs = [(h["key"], bytes(h["value"])) for h in (row["headers"] or [])] \
                    if has_headers else []
                self.rows.append(Seen(batch_id, started_ms, row["topic"], row["partition"],
                                      row["offset"], bytes(row["value"]), pairs))

    def keys(self) -> list[tuple[str, int, int]]:
        return [(r.topic, r.partition, r.offset) for r in self.rows]


def stream(spark: Any, bootstrap: str, topics: str, **options: str) -> Any:
    reader = (spark.readStream.format("redrive-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topics))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(spark: Any, bootstrap: str, topics: str, checkpoint: Path,
                      collector: Collector, **options: str) -> None:
    query = (stream(spark, bootstrap, topics, **options).writeStream
             .foreachBatch(collector).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive, "availableNow query did not finish"
    assert query.exception() is None


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def batch_read(spark: Any, bootstrap: str, topics: str, **options: str) -> Any:
    reader = (spark.read.format("redrive-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topics))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


# --- schema and options --------------------------------------------------------------------


def test_schema_is_that_of_sparks_kafka_source(spark: Any, bootstrap: str) -> None:
    plain = batch_read(spark, bootstrap, "any-topic")
    assert plain.schema == SPARK_KAFKA_SCHEMA
    with_headers = batch_read(spark, bootstrap, "any-topic", includeHeaders="true")
    assert with_headers.schema == StructType([*SPARK_KAFKA_SCHEMA.fields, SPARK_KAFKA_HEADERS])
    streaming = stream(spark, bootstrap, "any-topic", includeHeaders="true")
    assert streaming.schema == with_headers.schema


@pytest.mark.parametrize(("options", "named"), [
    ({"subscribe": "t"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "x:1"}, "subscribe"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "includeHeaders": "yes"},
     "includeHeaders"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingOffsets": "{bad"},
     "startingOffsets"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t",
      "startingOffsets": '{"other": {"0": 1}}'}, "other"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"},
     "maxOffsetsPerTrigger"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "kafka.auto.offset.reset": "latest"},
     "kafka.auto.offset.reset"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "redrive.gatedTopics": "a,(b"},
     "redrive.gatedTopics"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "redrive.reader": "fast"},
     "redrive.reader"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "redrive.decodeHeaders": "true"},
     "redrive.decodeHeaders='true': needs includeHeaders"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingTimestamp": "yesterday"},
     "startingTimestamp='yesterday': expected a timestamp in milliseconds"),
    # Digits to str.isdigit(), not to int().
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingTimestamp": "1²"},
     "startingTimestamp='1²': expected a timestamp in milliseconds"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingOffsets": '{"t": {"²": 1}}'},
     "partition '²' is not a non-negative integer"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t",
      "endingOffsetsByTimestamp": '{"t": {"0": -5}}'},
     "endingOffsetsByTimestamp='{\"t\": {\"0\": -5}}': t\\[0\\]: -5 must be"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t",
      "startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy='skip'"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "redrive.resumeTopics": "t"},
     "redrive.resumeTopics='t': needs redrive.group"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "redrive.group": "g",
      "redrive.resumeTopics": "t,u"}, "topic 'u' is not in subscribe"),
    # Spark's Kafka source plans by these; silently ignored, they would plan otherwise.
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "minPartitions": "8"},
     "minpartitions='8': not supported"),
    ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "maxTriggerDelay": "5m"},
     "maxtriggerdelay='5m': not supported"),
])
def test_bad_options_are_named_in_the_error(spark: Any, options: dict[str, str],
                                            named: str) -> None:
    with pytest.raises(Exception, match=named.replace(".", r"\.")):
        spark.read.format("redrive-kafka").options(**options).load()


def test_unknown_topic_is_named(spark: Any, bootstrap: str, unique_name: Any) -> None:
    missing = unique_name("missing")
    with pytest.raises(Exception, match=missing):
        batch_read(spark, bootstrap, missing).count()


def test_kafka_options_reach_the_client(spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 5)
    frame = batch_read(spark, bootstrap, topic, **{"kafka.fetch.max.bytes": "1048576"})
    assert frame.count() == 5
    with pytest.raises(Exception, match=r"no\.such\.property"):
        batch_read(spark, bootstrap, topic, **{"kafka.no.such.property": "1"}).count()


# --- batch reads ---------------------------------------------------------------------------


def test_batch_read_between_offsets(spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(2)
    header_list = [("h-bin", bytes(range(256))), ("h-empty", b""), ("h-bin", b"\x00again")]
    produce(bootstrap, topic, 30, partition=0, header_list=header_list)
    produce(bootstrap, topic, 20, partition=1, start=100, header_list=header_list)
    starting = json.dumps({topic: {"0": 10, "1": -2}})
    ending = json.dumps({topic: {"0": 25, "1": -1}})
    rows = batch_read(spark, bootstrap, topic, startingOffsets=starting, endingOffsets=ending,
                      includeHeaders="true").collect()
    got = sorted((r["partition"], r["offset"]) for r in rows)
    assert got == [(0, o) for o in range(10, 25)] + [(1, o) for o in range(20)]
    for row in rows:
        n = row["offset"] + (100 if row["partition"] == 1 else 0)
        assert bytes(row["key"]) == f"k{n}".encode()
        assert bytes(row["value"]) == f"v{n}".encode()
        assert [(h["key"], bytes(h["value"])) for h in row["headers"]] == header_list
        assert row["timestampType"] == 0  # CreateTime, as Spark reports it
        assert row["topic"] == topic
    default = batch_read(spark, bootstrap, topic).count()
    assert default == 50
    # Offsets outside a partition are named: the end past it waited 120 s for records that
    # never came, and a start past the end read nothing without a word.
    cases = [({"0": 10, "1": -2}, {"0": 31, "1": -1},
              f"endingOffsets=.*partition {topic}\\[0\\] ends at offset 30; 31 is past it"),
             ({"0": 20, "1": -2}, {"0": 10, "1": -1},
              f"startingOffsets=.*partition {topic}\\[0\\] would start at offset 20, after "
              "its ending offset 10"),
             ({"0": 40, "1": -2}, None,
              f"startingOffsets=.*partition {topic}\\[0\\] would start at offset 40, after "
              "its ending offset 30")]
    for start, end, message in cases:
        options = {"startingOffsets": json.dumps({topic: start})}
        if end is not None:
            options["endingOffsets"] = json.dumps({topic: end})
        started = time.monotonic()
        with pytest.raises(Exception, match=message):
            batch_read(spark, bootstrap, topic, **options).count()
        assert time.monotonic() - started < 30


def produce_at(bootstrap: str, topic: str, partition: int, times: list[int]) -> None:
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"v{i}".encode(), None, partition=partition, timestamp_ms=at)
        for i, at in enumerate(times)])


def test_reads_from_and_to_a_time(spark: Any, bootstrap: str, new_topic: Any,
                                  tmp_path: Path) -> None:
    topic = new_topic(2)
    t0 = int(time.time() * 1000) - 60_000
    produce_at(bootstrap, topic, 0, [t0 + i * 1000 for i in range(10)])
    produce_at(bootstrap, topic, 1, [t0 + i * 1000 + 500 for i in range(10)])

    def read(**options: str) -> list[tuple[int, int]]:
        rows = batch_read(spark, bootstrap, topic, **options).collect()
        return sorted((r["partition"], r["offset"]) for r in rows)

    def both(offsets: range) -> list[tuple[int, int]]:
        return [(p, o) for p in (0, 1) for o in offsets]

    # From the first record at or after the time: offset 3 in both (partition 1's third record
    # is at t0 + 2500); up to the first at or after the end time, excluded.
    assert read(startingTimestamp=str(t0 + 3000)) == both(range(3, 10))
    assert read(startingTimestamp=str(t0 + 3000), endingTimestamp=str(t0 + 6000)) == \
        both(range(3, 6))
    # One time per partition; as in Spark, the timestamp options come before startingOffsets.
    by_partition = json.dumps({topic: {"0": t0 + 8000, "1": t0}})
    assert read(startingOffsetsByTimestamp=by_partition, startingOffsets="earliest") == \
        [(0, 8), (0, 9)] + [(1, o) for o in range(10)]
    # An end past the last record is the partition's end.
    assert read(endingOffsetsByTimestamp=json.dumps({topic: {"0": t0 + 99_000,
                                                             "1": t0 + 4000}})) == \
        [(0, o) for o in range(10)] + [(1, o) for o in range(4)]
    # A start past the last record fails, naming the partition, unless asked to start at the end.
    with pytest.raises(Exception, match=f"startingTimestamp='{t0 + 99_000}': partition "
                       f"{topic}\\[0\\] holds no record at or after"):
        read(startingTimestamp=str(t0 + 99_000))
    assert read(startingTimestamp=str(t0 + 9200),
                startingOffsetsByTimestampStrategy="latest") == [(1, 9)]
    with pytest.raises(Exception, match=f"startingOffsetsByTimestamp=.*partition {topic}"
                       "\\[1\\] is not given"):
        read(startingOffsetsByTimestamp=json.dumps({topic: {"0": t0}}))
    # A stream starts there too, and later records are all read.
    collector = Collector()
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingTimestamp=str(t0 + 7000))
    assert sorted((r.partition, r.offset) for r in collector.rows) == both(range(7, 10))
    with pytest.raises(Exception, match=r"endingTimestamp=.*only batch queries"):
        stream(spark, bootstrap, topic, endingTimestamp=str(t0)).writeStream.format(
            "noop").start().awaitTermination(30)


def test_batch_read_rejects_what_spark_rejects(spark: Any, bootstrap: str) -> None:
    with pytest.raises(Exception, match="startingOffsets"):
        batch_read(spark, bootstrap, "t", startingOffsets="latest").count()
    with pytest.raises(Exception, match="endingOffsets"):
        batch_read(spark, bootstrap, "t", endingOffsets="earliest").count()


def test_read_committed_skips_aborted_and_stops_at_markers(spark: Any, bootstrap: str,
                                                           new_topic: Any,
                                                           unique_name: Any) -> None:
    topic = new_topic(1)
    produce_transactions(bootstrap, topic, unique_name("tx"),
                         [(["c0", "c1", "c2"], True), (["a0", "a1"], False), (["c3"], True)])
    # The range ends at the last commit marker, which is never delivered: the read must end
    # on the position, not wait for a record at end - 1 (which fails after the poll timeout).
    rows = batch_read(spark, bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "10000"}).collect()
    assert sorted(bytes(r["value"]).decode() for r in rows) == ["c0", "c1", "c2", "c3"]


# --- streaming -----------------------------------------------------------------------------


def test_restart_from_checkpoint_loses_and_repeats_nothing(spark: Any, bootstrap: str,
                                                           new_topic: Any,
                                                           tmp_path: Path) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, 600)
    collector = Collector()
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest")
    first = len(collector.rows)
    assert first == 600
    produce(bootstrap, topic, 400, start=600)
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest")
    keys = collector.keys()
    assert len(keys) == len(set(keys)) == 1000
    assert sorted(bytes(r.value) for r in collector.rows) == sorted(
        f"v{i}".encode() for i in range(1000))
    per_partition = {p: sorted(o for t, pp, o in keys if pp == p) for p in range(3)}
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))


def test_starting_offsets_latest_skips_what_was_there(spark: Any, bootstrap: str,
                                                      new_topic: Any, tmp_path: Path) -> None:
    topic = new_topic(2)
    produce(bootstrap, topic, 50)
    collector = Collector()
    query = (stream(spark, bootstrap, topic).writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="300 milliseconds").start())
    try:
        wait_for(lambda: len(query.recentProgress) > 0, 60, "the first trigger")
        produce(bootstrap, topic, 30, start=50)
        wait_for(lambda: len(collector.rows) >= 30, 60, "30 new records")
        time.sleep(1)
    finally:
        query.stop()
    assert sorted(r.value for r in collector.rows) == sorted(
        f"v{i}".encode() for i in range(50, 80))


def test_starting_offsets_json(spark: Any, bootstrap: str, new_topic: Any,
                               tmp_path: Path) -> None:
    topic = new_topic(2)
    produce(bootstrap, topic, 20, partition=0)
    produce(bootstrap, topic, 20, partition=1)
    collector = Collector()
    starting = json.dumps({topic: {"0": 15, "1": -2}})
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets=starting)
    assert sorted((r.partition, r.offset) for r in collector.rows) == (
        [(0, o) for o in range(15, 20)] + [(1, o) for o in range(20)])


def test_max_offsets_per_trigger_bounds_every_batch(spark: Any, bootstrap: str,
                                                    new_topic: Any, tmp_path: Path) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, 1000)
    collector = Collector()
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest", maxOffsetsPerTrigger="150")
    assert [size for size in collector.batch_sizes if size] == [150] * 6 + [100]
    assert len(set(collector.keys())) == 1000


def test_offsets_are_committed_to_the_group(spark: Any, bootstrap: str, new_topic: Any,
                                            unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(2)
    produce(bootstrap, topic, 40, partition=0)
    produce(bootstrap, topic, 25, partition=1)
    group = unique_name("group")
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", Collector(),
                      startingOffsets="earliest", **{"redrive.group": group})
    consumer = kafka.consumer(bootstrap, group)
    try:
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)],
                                       timeout=10)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 40, 1: 25}


def test_new_partitions_are_read_from_earliest(spark: Any, bootstrap: str, new_topic: Any,
                                               tmp_path: Path) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 10, partition=0)
    collector = Collector()
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest")
    admin = kafka.admin(bootstrap)
    for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
        future.result(30)
    produce(bootstrap, topic, 7, partition=1, start=10)
    produce(bootstrap, topic, 3, partition=0, start=17)
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest")
    assert sorted((r.partition, r.offset) for r in collector.rows) == (
        [(0, o) for o in range(13)] + [(1, o) for o in range(7)])


def test_a_topic_back_in_the_subscription_goes_on_where_the_group_stood(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A retry topic leaves the subscription (its policy was changed) and comes back (the change
    was reverted) on the same checkpoint, which forgot its offsets: it is read from where
    redrive.group stands on it, not from its start again."""
    main, retry = new_topic(1), new_topic(1)
    group = unique_name("back")
    options = {"startingOffsets": "earliest", "redrive.group": group}
    produce(bootstrap, main, 3, partition=0)
    produce(bootstrap, retry, 10, partition=0)
    collector = Collector()
    checkpoint = tmp_path / "ck"
    run_available_now(spark, bootstrap, f"{main},{retry}", checkpoint, collector, **options)
    produce(bootstrap, main, 2, partition=0, start=3)
    run_available_now(spark, bootstrap, main, checkpoint, collector, **options)
    produce(bootstrap, retry, 2, partition=0, start=10)
    produce(bootstrap, main, 1, partition=0, start=5)
    run_available_now(spark, bootstrap, f"{main},{retry}", checkpoint, collector, **options)
    assert sorted(collector.keys()) == sorted(
        [(main, 0, o) for o in range(6)] + [(retry, 0, o) for o in range(12)])
    # A partition the group never committed on still starts at its earliest offset.
    fresh = new_topic(1)
    produce(bootstrap, fresh, 4, partition=0)
    run_available_now(spark, bootstrap, f"{main},{retry},{fresh}", checkpoint, collector,
                      **options)
    read = collector.keys()
    assert sorted(k for k in read if k[0] == fresh) == [(fresh, 0, o) for o in range(4)]


def test_deleted_records_fail_the_query_unless_allowed(spark: Any, bootstrap: str,
                                                       new_topic: Any, tmp_path: Path) -> None:
    topic = new_topic(1)
    produce(bootstrap, topic, 10)
    collector = Collector()
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      startingOffsets="earliest")
    produce(bootstrap, topic, 20, start=10)
    admin = kafka.admin(bootstrap)
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(30)
    query = (stream(spark, bootstrap, topic).writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="data loss"):
        query.awaitTermination(60)
    run_available_now(spark, bootstrap, topic, tmp_path / "ck", collector,
                      failOnDataLoss="false")
    assert sorted(r.offset for r in collector.rows) == [*range(10), *range(20, 30)]


# --- the due gate --------------------------------------------------------------------------


def test_no_record_arrives_before_its_due_time(spark: Any, bootstrap: str, new_topic: Any,
                                              tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    retry = new_topic(2)
    main = new_topic(1)
    now = int(time.time() * 1000)
    due: dict[tuple[int, int], int | None] = {}
    producer = input_producer(bootstrap)
    for partition in range(2):
        records = []
        for offset in range(25):
            kind = rng.random()
            if kind < 0.15:
                value_due = None
            elif kind < 0.3:
                value_due = now - rng.randrange(1, 60_000)
            else:
                value_due = now + rng.randrange(500, 8_000)
            due[(partition, offset)] = value_due
            hs = [] if value_due is None else [(headers.DUE, str(value_due).encode())]
            records.append(kafka.OutRecord(retry, b"r", headers=hs, partition=partition))
        kafka.produce_confirmed(producer, records)
    # The main topic is outside redrive.gatedTopics: its due headers are not looked at.
    kafka.produce_confirmed(producer, [kafka.OutRecord(
        main, b"m", headers=[(headers.DUE, str(now + 3_600_000).encode())])
        for _ in range(5)])
    collector = Collector()
    query = (stream(spark, bootstrap, f"{retry},{main}", startingOffsets="earliest",
                    includeHeaders="true", **{"redrive.gatedTopics": retry})
             .writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="250 milliseconds").start())
    try:
        wait_for(lambda: len(collector.rows) >= 55, 45, f"all 55 records (seed {seed})")
    finally:
        query.stop()
    seen = [r for r in collector.rows if r.topic == retry]
    assert len({(r.partition, r.offset) for r in seen}) == len(seen) == 50
    for row in seen:
        value_due = due[(row.partition, row.offset)]
        assert value_due is None or row.started_ms >= value_due, (
            f"seed {seed}: {retry}[{row.partition}]@{row.offset} due {value_due} "
            f"arrived at {row.started_ms}")
    main_rows = [r for r in collector.rows if r.topic == main]
    assert len(main_rows) == 5


# --- the driver's gate scan, without Spark jobs ---------------------------------------------


def _reader(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", **extra}
    return KafkaStreamReader(SourceOptions.parse(options))


@pytest.fixture
def counted_scans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    from redrive.spark import planning

    calls: list[int] = []
    original = planning.Broker.scan

    def scan(self: Any, tp: Any, scan_state: Any, target: int, now_ms: int) -> None:
        calls.append(scan_state.clear_to)
        original(self, tp, scan_state, target, now_ms)

    monkeypatch.setattr(planning.Broker, "scan", scan)
    yield calls


def test_gate_scan_reads_each_record_once(bootstrap: str, new_topic: Any,
                                          counted_scans: list[int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic(1)
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(source, "now_ms", lambda: clock[0])
    due_ms = clock[0] + 3_600_000
    held = [(headers.DUE, str(due_ms).encode())]
    records = [kafka.OutRecord(topic, b"due") for _ in range(5)]
    records += [kafka.OutRecord(topic, b"later", headers=held) for _ in range(3)]
    produce_input(bootstrap, records)
    reader = _reader(bootstrap, topic)
    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 5}}
        assert counted_scans == [0]
        # Held: the next call neither rescans the due records nor reads the held one.
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 5}}
        assert counted_scans == [0]
        clock[0] = due_ms
        end = reader.latestOffset({topic: {"0": 5}}, ReadAllAvailable())
        assert end == {topic: {"0": 8}}
        assert counted_scans == [0, 6]
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        assert counted_scans == [0, 6]
    finally:
        reader.stop()


def test_an_available_now_run_started_past_its_target_reads_nothing_and_loses_nothing(
        bootstrap: str, new_topic: Any) -> None:
    # Spark prepares an availableNow run before it resolves `latest` for a new checkpoint:
    # records written in between put the start past the target, which read as data loss.
    topic = new_topic(1)
    producer = input_producer(bootstrap)
    kafka.produce_confirmed(producer, [kafka.OutRecord(topic, b"before")] * 5)
    reader = _reader(bootstrap, topic, startingOffsets="latest")
    try:
        reader.prepareForTriggerAvailableNow()
        kafka.produce_confirmed(producer, [kafka.OutRecord(topic, b"meanwhile")] * 3)
        start = reader.initialOffset()
        assert start == {topic: {"0": 8}}
        assert reader.latestOffset(start, ReadAllAvailable()) == start
    finally:
        reader.stop()


def test_ungated_topics_are_never_scanned(bootstrap: str, new_topic: Any,
                                          counted_scans: list[int]) -> None:
    topic = new_topic(1)
    future = [(headers.DUE, str(int(time.time() * 1000) + 3_600_000).encode())]
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"x", headers=future)] * 4)
    for extra in ({"redrive.gate": "false"}, {"redrive.gatedTopics": "other,retry-.*"}):
        reader = _reader(bootstrap, topic, **extra)
        try:
            start = reader.initialOffset()
            assert reader.latestOffset(start, ReadMaxRows(3)) == {topic: {"0": 3}}
        finally:
            reader.stop()
    assert counted_scans == []


def test_reader_pickles_without_clients(bootstrap: str, new_topic: Any) -> None:
    import pickle

    topic = new_topic(1)
    reader = _reader(bootstrap, topic)
    try:
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        copy = pickle.loads(pickle.dumps(reader))
        assert copy.options == reader.options
        assert copy._broker is None
    finally:
        reader.stop()


def test_rate_limit_never_exceeds_the_limit() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    latest = {("t", 0): 7, ("t", 1): 110, ("t", 2): 5}
    ends = rate_limit(start, latest, 50)
    assert sum(ends[tp] - start[tp] for tp in start) == 50
    assert all(start[tp] <= ends[tp] <= latest[tp] for tp in start)
    assert rate_limit(start, latest, 1_000) == latest
    # Spark compares offsets as JSON text, so the order must not depend on insertion.
    assert json.dumps(offsets_to_json({("b", 10): 1, ("b", 9): 2, ("a", 0): 3})) == (
        '{"a": {"0": 3}, "b": {"9": 2, "10": 1}}')


def test_planning_waits_out_a_broker_outage_then_fails_naming_the_broker(
        bootstrap: str, new_topic: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic(1)
    produce_input(bootstrap, [kafka.OutRecord(topic, b"x")] * 3)
    pauses: list[float] = []
    planner, really_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        # time.sleep is one function for every thread: others (a client's, a timer's) sleep.
        if threading.get_ident() == planner:
            pauses.append(seconds)
        else:
            really_sleep(seconds)

    monkeypatch.setattr(source.time, "sleep", sleep)
    reader = _reader(bootstrap, topic)
    try:
        start = reader.initialOffset()
        real = reader.broker.list_offsets
        outage = [3]  # the number of requests the brokers do not answer

        def list_offsets(*args: Any) -> Any:
            if outage[0] > 0:
                outage[0] -= 1
                raise BrokerUnavailable(bootstrap, "Failed to get metadata: transport failure")
            return real(*args)

        monkeypatch.setattr(reader.broker, "list_offsets", list_offsets)
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 3}}
        assert pauses == [0.5, 1.0, 2.0]  # growing intervals, then the batch is planned

        pauses.clear()
        outage[0] = 1_000  # longer than planning waits
        with pytest.raises(BrokerUnavailable, match=bootstrap.replace(".", r"\.")):
            reader.latestOffset(start, ReadAllAvailable())
        assert sum(pauses[:-1]) < source.OUTAGE_WAIT_S <= sum(pauses)
        assert max(pauses) == source.MAX_RETRY_S
    finally:
        reader.stop()
