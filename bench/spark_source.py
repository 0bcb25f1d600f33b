"""Benchmark of the redrive-kafka Spark source against a raw consumer and a no-broker source.

    python bench/spark_source.py [--quick] [--bootstrap HOST:PORT] [--records N] [--json]

Starts its own noida-db unless --bootstrap is given, fills one topic, then measures records/s of
  (a) the redrive-kafka source: a batch read of the whole topic and `.count()`,
  (b) a raw confluent-kafka consumer reading the same records (assign, consume in batches),
  (c) an in-memory Python data source with the same schema and row count and no broker, in the
      same SparkSession: the ceiling of the Python data source path on this machine.
Spark figures are the best of --runs runs after a warm-up query, so session start-up and the
first job's JVM warm-up are left out; each still includes Spark's fixed per-query cost.
P5 = a / b, P5c = a / c. With --json the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from redrive import kafka
from redrive.devbroker import DevBroker
from redrive.spark.source import kafka_schema, register

PARTITIONS = 2
VALUE_BYTES = 100
ROWS_PER_BATCH = 20_000
# noida-db ignores fetch.max.bytes and max.partition.fetch.bytes and answers a fetch with the
# whole backlog of the partitions asked for; above librdkafka's default receive limit (100 MB)
# a consumer stalls on "Invalid response size". Room for 1M records per connection and more.
CONSUMER_OVERRIDES = {"receive.message.max.bytes": 1_000_000_000}


def fill(bootstrap: str, records: int) -> str:
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: PARTITIONS})
    producer = kafka.producer(bootstrap, overrides={"linger.ms": 20, "batch.size": 1_000_000})
    value = b"x" * VALUE_BYTES
    for i in range(records):
        kafka.produce(producer, kafka.OutRecord(topic, value, key=b"k%d" % (i % 1000)))
    if producer.flush(120) != 0:
        raise SystemExit(f"filling {topic}: records still unconfirmed after 120 s")
    return topic


def raw_consumer(bootstrap: str, topic: str, records: int) -> float:
    consumer = kafka.consumer(bootstrap, overrides=CONSUMER_OVERRIDES)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    started = time.perf_counter()
    try:
        while seen < records:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    seen += 1
    finally:
        consumer.close()
    return records / (time.perf_counter() - started)


class MemoryRange(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class MemoryReader(DataSourceReader):
    """Builds Arrow batches from Python lists as redrive-kafka does, minus the broker."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[MemoryRange]:
        share = self.rows // PARTITIONS
        return [MemoryRange(share + (1 if p < self.rows % PARTITIONS else 0))
                for p in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MemoryRange)
        schema = to_arrow_schema(kafka_schema(), timezone="UTC")
        value = b"x" * VALUE_BYTES
        now_us = int(time.time() * 1_000_000)
        done = 0
        while done < partition.rows:
            n = min(ROWS_PER_BATCH, partition.rows - done)
            keys = [b"k%d" % (i % 1000) for i in range(done, done + n)]
            values = [value] * n
            offsets = list(range(done, done + n))
            yield pa.RecordBatch.from_arrays([
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.repeat(pa.scalar("memory", pa.string()), n),
                pa.repeat(pa.scalar(0, pa.int32()), n),
                pa.array(offsets, pa.int64()),
                pa.array([now_us] * n, schema.field("timestamp").type),
                pa.array([0] * n, pa.int32()),
            ], schema=schema)
            done += n


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "redrive-bench-memory"

    def schema(self) -> StructType:
        return kafka_schema()

    def reader(self, schema: StructType) -> MemoryReader:
        return MemoryReader(int(self.options["rows"]))


def best_rate(run: Callable[[], int], records: int, runs: int) -> float:
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        counted = run()
        elapsed = time.perf_counter() - started
        if counted != records:
            raise SystemExit(f"counted {counted} records, expected {records}")
        rates.append(records / elapsed)
    return max(rates)


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("redrive-bench-spark-source")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    session.dataSource.register(MemorySource)
    return session


def measure(bootstrap: str, records: int, runs: int) -> dict[str, float]:
    print(f"filling a {PARTITIONS}-partition topic with {records:,} records "
          f"of {VALUE_BYTES} bytes ...", file=sys.stderr)
    topic = fill(bootstrap, records)
    warm_topic = fill(bootstrap, 1_000)
    raw = max(raw_consumer(bootstrap, topic, records) for _ in range(3))
    spark = spark_session()

    def redrive_count(name: str, expected: int) -> Callable[[], int]:
        return lambda: int(spark.read.format("redrive-kafka")
                           .option("kafka.bootstrap.servers", bootstrap)
                           .options(**{f"kafka.{k}": str(v)
                                       for k, v in CONSUMER_OVERRIDES.items()})
                           .option("subscribe", name).load().count())

    def memory_count() -> int:
        return int(spark.read.format("redrive-bench-memory").option("rows", records)
                   .load().count())

    best_rate(redrive_count(warm_topic, 1_000), 1_000, 1)
    source = best_rate(redrive_count(topic, records), records, runs)
    memory = best_rate(memory_count, records, runs)
    spark.stop()
    return {"records": records, "redrive_source_rps": source, "raw_consumer_rps": raw,
            "memory_source_rps": memory, "P5": source / raw, "P5c": source / memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="use this cluster instead of starting noida-db")
    parser.add_argument("--quick", action="store_true", help="100k records instead of 1M")
    parser.add_argument("--records", type=int, help="records to fill the topic with")
    parser.add_argument("--runs", type=int, default=2, help="timed Spark runs per figure")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    records = args.records or (100_000 if args.quick else 1_000_000)
    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60.0)
    try:
        figures = measure(broker.bootstrap if broker is not None else args.bootstrap,
                          records, args.runs)
    finally:
        if broker is not None:
            broker.close()
    print(f"{'measure':<44}{'records/s':>14}")
    print(f"{'(a) redrive-kafka batch read, count()':<44}{figures['redrive_source_rps']:>14,.0f}")
    print(f"{'(b) raw confluent-kafka consumer':<44}{figures['raw_consumer_rps']:>14,.0f}")
    print(f"{'(c) in-memory Python source, no broker':<44}{figures['memory_source_rps']:>14,.0f}")
    print(f"P5  = a / b = {figures['P5']:.3f}")
    print(f"P5c = a / c = {figures['P5c']:.3f}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
