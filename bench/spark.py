"""Benchmark of redrive on PySpark: the redrive-kafka source (P5, P5c) and RetryPipeline (P6).

    python bench/spark.py [--quick] [--records N] [--bootstrap HOST:PORT] [--runs N]
                          [--only p5|p6|p8] [--malloc-kept] [--json]

Starts its own noida-db unless --bootstrap is given, fills one topic (2 partitions, 100-byte
values) and measures, in one local[2] SparkSession, after a warm-up query:

  P5   records/s of the redrive-kafka source counting the topic (a batch read and `.count()`)
       / records/s of a raw confluent-kafka consumer reading the same records (assign, consume in
       batches of 10,000), run beside it in each round: the median of the rounds' ratios.
                                                                                    goal >= 0.5
  P5c  the same source figure / an in-memory Python data source with the same schema and row count
       and no broker, building its rows in Python per batch: how close the Kafka part comes to
       what a Python data source carries.                                           goal >= 0.8
       Beside it, the source against an in-memory source that yields batches built once: what
       Spark's Python data source path itself carries, with no per-row work at all.
  P6   records/s of a RetryPipeline whose function fails for --fail-rate of the records (routed to
       a retry topic with a 1h backoff, so no retry is read back during the measurement)
       / the same pipeline (same source, same mapInArrow function step, same no-op sink) with a
       function that never fails, so nothing is routed.                              goal >= 0.85
  P8   records/s of a RetryPipeline in the DataFrame form (a transform in Spark SQL failing the
       same records, routed the same way) / the same source -> same transform -> same sink in a
       plain foreachBatch query with no routing.                                     goal >= 0.85
       p8_vs_function: the DataFrame form's records/s / the per-record function's (P6's routed
       pipeline) on the same records.                                                 goal >= 5
       connect: the DataFrame-form pipeline's records/s on Spark Connect (a local Connect server
       on local[2], from the pyspark wheel) / on the classic session.               goal >= 0.8

Every figure is the median of --runs runs. A pipeline run is timed from `run()` (query start,
included) to the end of the batch that handled the last main-topic record; by default one
micro-batch holds the whole topic (maxOffsetsPerTrigger = --records). Shown beside P6, not part of
it: the pipeline's fixed cost per query (a run over a 2,000-record topic), and a bare query over
the same source and function step with one action per batch and none of the pipeline's own
work (persist, routing job, counts), which bounds what the pipeline could reach.
Before the P5 runs and before every pipeline run the bench waits for the broker to go idle:
noida-db rewrites all it holds after any write (a fill, a committed offset, a produced record),
which must not fall on the next run. Beside P5c: the CPU time of the whole machine and of the
broker per record during each source's runs, and P5c by CPU time with the broker's share left out
(on 2 cores the broker competes with Spark). --malloc-kept runs Spark's Python workers with glibc
settings that keep freed memory. With --json the last line is one JSON object of the figures.
--only p5 (or p6, p8) measures only those figures (the others are left out, null in the JSON), to
save time while working on one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from common import CpuMeter, settle
from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.dev.spark import ConnectServer
from redrive.policy import Backoff, RetryPolicy
from redrive.spark.options import kafka_schema
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.source import register
from redrive.spark.sql import functions

PARTITIONS = 2
VALUE_BYTES = 100
ROWS_PER_BATCH = 20_000
# noida-db ignores fetch.max.bytes and max.partition.fetch.bytes and answers a fetch with the
# whole backlog of the partitions asked for; above librdkafka's default receive limit (100 MB)
# a consumer stalls on "Invalid response size". Room for 1M records per connection and more.
CONSUMER_OVERRIDES: Mapping[str, Any] = {"receive.message.max.bytes": 1_000_000_000}
GOALS = {"p5": 0.5, "p5c": 0.8, "p6": 0.85, "p8": 0.85, "p8_vs_function": 5.0, "connect": 0.8}
BACKOFF = "1h"
OUTPUT_SCHEMA = "n int"
FIXED_COST_RECORDS = 2_000


# --- the data ------------------------------------------------------------------------------


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


def fails(offset: int, fail_per_10k: int) -> bool:
    """A fixed, evenly spread set of offsets whose records fail."""
    return (offset * 2654435761) % 10_000 < fail_per_10k


def handle(record: dict[str, Any], fail_per_10k: int) -> dict[str, Any]:
    """The user's function: trivial work, failing for a fixed share of the records."""
    if fails(int(record["offset"]), fail_per_10k):
        raise ConnectionError("upstream unavailable")
    return {"n": len(record["value"] or b"")}


def failing_transform(frame: Any, fail_per_10k: int) -> Any:
    """The DataFrame form of `handle`: the same records fail, in Spark SQL."""
    F = functions(frame)
    failed = (F.col("offset") * F.lit(2654435761)) % 10_000 < fail_per_10k
    error = F.when(failed, F.struct(F.lit("ConnectionError").alias("type"),
                                    F.lit("upstream unavailable").alias("message")))
    return frame.select("topic", "partition", "offset", F.length("value").alias("n"),
                        error.alias("error"))


# --- P5: the source against a raw consumer and a no-broker source ---------------------------


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
    """Builds Arrow batches from Python lists, as a Python source that makes its rows must; with
    `prebuilt`, builds one batch and yields it again and again, which leaves only what Spark's
    Python data source path itself costs (the ceiling any source, redrive-kafka included, is
    under)."""

    def __init__(self, rows: int, prebuilt: bool) -> None:
        self.rows = rows
        self.prebuilt = prebuilt

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
        built: pa.RecordBatch | None = None
        while done < partition.rows:
            n = min(ROWS_PER_BATCH, partition.rows - done)
            if self.prebuilt and built is not None:
                yield built if n == built.num_rows else built.slice(0, n)
                done += n
                continue
            keys = [b"k%d" % (i % 1000) for i in range(done, done + n)]
            values = [value] * n
            offsets = list(range(done, done + n))
            built = pa.RecordBatch.from_arrays([
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.repeat(pa.scalar("memory", pa.string()), n),
                pa.repeat(pa.scalar(0, pa.int32()), n),
                pa.array(offsets, pa.int64()),
                pa.array([now_us] * n, schema.field("timestamp").type),
                pa.array([0] * n, pa.int32()),
            ], schema=schema)
            yield built
            done += n


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "redrive-bench-memory"

    def schema(self) -> StructType:
        return kafka_schema()

    def reader(self, schema: StructType) -> MemoryReader:
        return MemoryReader(int(self.options["rows"]), self.options.get("prebuilt") == "true")


@dataclass(frozen=True)
class Count:
    rate: float  # records/s
    machine_cpu_us: float  # CPU time of every process on the machine, per record
    broker_cpu_us: float | None  # of those, the broker's (None: not started here)


def timed_count(count: Callable[[], int], records: int, meter: CpuMeter) -> Count:
    machine, broker = meter.read()
    started = time.perf_counter()
    counted = count()
    elapsed = time.perf_counter() - started
    machine_after, broker_after = meter.read()
    if counted != records:
        raise SystemExit(f"counted {counted} records, expected {records}")
    broker_us = None if broker is None or broker_after is None \
        else (broker_after - broker) / records * 1e6
    return Count(records / elapsed, (machine_after - machine) / records * 1e6, broker_us)


# --- P6: RetryPipeline with and without routing ---------------------------------------------


def noop_sink(frame: Any, batch_id: int) -> None:
    frame.write.format("noop").mode("append").save()


@dataclass(frozen=True)
class PipelineRun:
    records: int
    wall_s: float
    first_batch_s: float
    first_batch_records: int
    batches: int
    routed: int
    broker_cpu_s: float | None  # the broker's CPU time during the run
    steps_s: Mapping[str, float]  # the batches' steps, summed (PipelineStats.step_seconds)

    @property
    def rate(self) -> float:
        return self.records / self.wall_s

    @property
    def steady_rate(self) -> float | None:
        """Records/s after the first batch: without the query's start, which on Spark Connect
        includes starting the server's foreachBatch worker. None for a one-batch run."""
        if self.first_batch_records >= self.records:
            return None
        return (self.records - self.first_batch_records) / (self.wall_s - self.first_batch_s)


class Bench:
    """One SparkSession and one filled topic; each run reads the topic in a new group, whose
    retry and dead-letter topics are deleted after it."""

    def __init__(self, spark: Any, bootstrap: str, topic: str, records: int, workdir: Path,
                 max_offsets: int, meter: CpuMeter) -> None:
        self.spark = spark
        self.meter = meter
        self.bootstrap = bootstrap
        self.connection = {"bootstrap.servers": bootstrap, **CONSUMER_OVERRIDES}
        self.topic = topic
        self.records = records
        self.workdir = workdir
        self.max_offsets = max_offsets

    def pipeline(self, fail_per_10k: int, sink: Callable[[Any, int], None],
                 on_batch: Callable[[int, PipelineStats], None] | None = None,
                 topic: str | None = None, form: str = "function",
                 spark: Any = None) -> RetryPipeline:
        """form "function" (per record, P6) or "transform" (the DataFrame form, P8)."""
        group = f"bench-{uuid.uuid4().hex[:8]}"
        shape: dict[str, Any] = (
            {"transform": partial(failing_transform, fail_per_10k=fail_per_10k)}
            if form == "transform" else
            {"function": partial(handle, fail_per_10k=fail_per_10k),
             "output_schema": OUTPUT_SCHEMA})
        return RetryPipeline(
            spark or self.spark, self.connection, topic or self.topic, group,
            RetryPolicy(backoff=Backoff.fixed(BACKOFF)), **shape,
            sink=sink, checkpoint=str(self.workdir / group),
            trigger_interval="0 seconds", max_offsets_per_trigger=self.max_offsets,
            on_batch=on_batch)

    def run_pipeline(self, fail_per_10k: int, *, topic: str | None = None,
                     records: int | None = None, form: str = "function",
                     spark: Any = None) -> PipelineRun:
        records = self.records if records is None else records
        marks: list[tuple[float, int]] = []

        def on_batch(batch_id: int, stats: PipelineStats) -> None:
            marks.append((time.perf_counter(), stats.records))

        pipeline = self.pipeline(fail_per_10k, noop_sink, on_batch, topic, form, spark)
        # Made before the broker settles, as for the plain query: a pipeline makes its topics at
        # its first start only, and on noida-db making them sets off a rewrite of all it holds.
        pipeline.ensure_topics()
        settle(self.meter)
        _, broker_before = self.meter.read()
        started = time.perf_counter()
        stats = pipeline.run(until=lambda s: s.records >= records,
                             timeout_s=300 + records / 1_000, poll_s=0.05)
        _, broker_after = self.meter.read()
        done = [at for at, seen in marks if seen >= records]
        if not done:
            raise SystemExit(f"pipeline {pipeline.group} handled {stats.records} of {records} "
                             "records before its timeout")
        if stats.records != records or stats.succeeded + stats.retried != records \
                or stats.early or stats.dead_lettered:
            raise SystemExit(f"pipeline {pipeline.group}: unexpected outcome {stats}")
        first_at, first_seen = marks[0]
        broker_cpu = None if broker_before is None or broker_after is None \
            else broker_after - broker_before
        self.drop_topics(pipeline)
        return PipelineRun(records, done[0] - started, first_at - started, first_seen,
                           len([at for at in marks if at[0] <= done[0]]), stats.retried,
                           broker_cpu, dict(stats.step_seconds))

    def drop_topics(self, pipeline: RetryPipeline) -> None:
        """Delete a finished run's retry and dead-letter topics: noida-db's rewrites after each
        write cost in proportion to all it holds, so each run's copies would tax the next runs."""
        kafka.delete_topics(kafka.admin(self.bootstrap),
                            [name for plan in pipeline.plans.values()
                             for name in plan.created_topics])

    def run_bare(self) -> float:
        """Records/s of source -> function step -> one count per batch, nothing else."""
        pipeline = self.pipeline(0, noop_sink)
        pipeline.ensure_topics()
        seen = [0]
        finished = threading.Event()
        ended: list[float] = []
        settle(self.meter)

        def batch(frame: Any, batch_id: int) -> None:
            seen[0] += int(pipeline.processed(frame).count())
            if seen[0] >= self.records and not ended:
                ended.append(time.perf_counter())
                finished.set()

        started = time.perf_counter()
        query = (pipeline.stream().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", pipeline.checkpoint)
                 .trigger(processingTime="0 seconds").start())
        try:
            deadline = time.monotonic() + 300 + self.records / 1_000
            while not finished.wait(0.05):
                if not query.isActive or time.monotonic() > deadline:
                    raise SystemExit(f"bare query counted {seen[0]} of {self.records} records: "
                                     f"{query.exception()}")
        finally:
            query.stop()
        if seen[0] != self.records:
            raise SystemExit(f"bare query counted {seen[0]} records, expected {self.records}")
        return self.records / (ended[0] - started)

    def run_plain_transform(self, fail_per_10k: int) -> float:
        """Records/s of P8's baseline: the pipeline's source and transform, its successes to the
        same no-op sink, in a plain foreachBatch query; failed rows are dropped, not routed.
        Rows are counted from the query's progress, so the baseline reads each batch once.
        The end is stamped by this loop when it sees the last batch's progress, polling as
        often as run_pipeline's run() reads the ledger for the pipeline's last batch: both
        figures end when the client learns the last batch is done, not one inside the body."""
        pipeline = self.pipeline(fail_per_10k, noop_sink, form="transform")
        pipeline.ensure_topics()
        transform = partial(failing_transform, fail_per_10k=fail_per_10k)
        settle(self.meter)

        def batch(frame: Any, batch_id: int) -> None:
            noop_sink(transform(frame).where("error IS NULL").drop("error"), batch_id)

        started = time.perf_counter()
        query = (pipeline.stream().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", pipeline.checkpoint)
                 .trigger(processingTime="0 seconds").start())
        try:
            deadline = time.monotonic() + 300 + self.records / 1_000
            while True:
                sizes = [p.numInputRows for p in query.recentProgress if p.numInputRows]
                if sum(sizes) >= self.records:
                    ended = time.perf_counter()
                    break
                if not query.isActive or time.monotonic() > deadline:
                    raise SystemExit(f"plain transform query read {sum(sizes)} of "
                                     f"{self.records} records: {query.exception()}")
                time.sleep(0.05)
        finally:
            query.stop()
        if sum(sizes) != self.records:
            raise SystemExit(f"plain transform query read {sum(sizes)} records, "
                             f"expected {self.records}")
        self.drop_topics(pipeline)
        return self.records / (ended - started)


# --- the run -------------------------------------------------------------------------------


# glibc settings for the Python workers (--malloc-kept): one arena, and freed memory kept rather
# than handed back to the kernel, so that memory freed by one batch is not faulted in again by the
# next. Process-wide, so redrive never sets them itself.
MALLOC_KEPT = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "1000000000",
               "MALLOC_MMAP_THRESHOLD_": "1000000000"}


def spark_session(malloc_kept: bool = False) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").appName("redrive-bench-spark")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "4g"))
    for name, value in (MALLOC_KEPT.items() if malloc_kept else ()):
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    session.dataSource.register(MemorySource)
    return session


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def measure(bootstrap: str, records: int, runs: int, fail_per_10k: int,
            max_offsets: int, only: str | None = None,
            broker_pid: int | None = None, malloc_kept: bool = False) -> dict[str, Any]:
    p5, p6, p8 = only in (None, "p5"), only in (None, "p6"), only in (None, "p8")
    say(f"filling a {PARTITIONS}-partition topic with {records:,} records of {VALUE_BYTES} "
        "bytes ...")
    topic = fill(bootstrap, records)
    small_topic = fill(bootstrap, FIXED_COST_RECORDS)
    say("starting Spark ...")
    spark = spark_session(malloc_kept)
    workdir = Path(tempfile.mkdtemp(prefix="redrive-bench-spark-"))
    try:
        def redrive_count(name: str) -> int:
            return int(spark.read.format("redrive-kafka")
                       .option("kafka.bootstrap.servers", bootstrap)
                       .options(**{f"kafka.{k}": str(v) for k, v in CONSUMER_OVERRIDES.items()})
                       .option("subscribe", name).load().count())

        def memory_count(rows: int = records, prebuilt: bool = False) -> int:
            return int(spark.read.format("redrive-bench-memory").option("rows", rows)
                       .option("prebuilt", str(prebuilt).lower()).load().count())

        meter = CpuMeter(broker_pid)
        bench = Bench(spark, bootstrap, topic, records, workdir, max_offsets, meter)
        say(f"the broker was idle after {settle(meter):.0f} s; warming up ...")
        # Every source of P5 gets the same warm-up: one full count, so that the JVM has compiled
        # the paths the timed runs take (with a small one, rates still rose run after run).
        timed_count(partial(redrive_count, small_topic), FIXED_COST_RECORDS, meter)
        if p5:
            raw_consumer(bootstrap, topic, records)
            timed_count(partial(redrive_count, topic), records, meter)
            timed_count(memory_count, records, meter)
            timed_count(partial(memory_count, prebuilt=True), records, meter)
        if p6 or p8:
            bench.run_pipeline(fail_per_10k, topic=small_topic, records=FIXED_COST_RECORDS)
        if p8:
            bench.run_pipeline(fail_per_10k, topic=small_topic, records=FIXED_COST_RECORDS,
                               form="transform")
        sources: list[Count] = []
        memories: list[Count] = []
        ceilings: list[Count] = []
        raws: list[float] = []
        settle(meter)  # counts and the raw consumer write nothing: once is enough
        for run in range(runs if p5 else 0):
            say(f"P5/P5c run {run + 1}/{runs} ...")
            # The raw consumer beside the source in each round, alternating which goes first.
            if run % 2:
                raws.append(raw_consumer(bootstrap, topic, records))
            sources.append(timed_count(partial(redrive_count, topic), records, meter))
            if not run % 2:
                raws.append(raw_consumer(bootstrap, topic, records))
            memories.append(timed_count(memory_count, records, meter))
            ceilings.append(timed_count(partial(memory_count, prebuilt=True), records, meter))
        plain: list[PipelineRun] = []
        routed: list[PipelineRun] = []
        if p6:
            fixed = bench.run_pipeline(0, topic=small_topic, records=FIXED_COST_RECORDS).wall_s
            for run in range(runs):
                # Alternate which goes first, so drift during the runs does not favour either.
                for fail in (0, fail_per_10k) if run % 2 == 0 else (fail_per_10k, 0):
                    say(f"P6 run {run + 1}/{runs}: {fail / 100:g}% of records failing ...")
                    (routed if fail else plain).append(bench.run_pipeline(fail))
            say("bare query ...")
            bare = bench.run_bare()
        frames: list[PipelineRun] = []
        plain_transforms: list[float] = []
        remote: list[PipelineRun] = []
        if p8:
            for run in range(runs):
                say(f"P8 run {run + 1}/{runs}: DataFrame form, routing and plain ...")
                if not p6:
                    routed.append(bench.run_pipeline(fail_per_10k))
                frames.append(bench.run_pipeline(fail_per_10k, form="transform"))
                plain_transforms.append(bench.run_plain_transform(fail_per_10k))
            remote = measure_connect(bench, workdir, fail_per_10k, runs, small_topic)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    figures: dict[str, Any] = {"records": records, "runs": runs,
                               "fail_rate": fail_per_10k / 10_000, "malloc_kept": malloc_kept}
    if p5:
        source_rates, memory_rates = [c.rate for c in sources], [c.rate for c in memories]
        source, memory = median(source_rates), median(memory_rates)
        source_cpu = median([c.machine_cpu_us for c in sources])
        memory_cpu = median([c.machine_cpu_us for c in memories])
        p5_runs = [s / r for s, r in zip(source_rates, raws, strict=True)]
        figures.update({
            "p5": median(p5_runs),
            "p5c": source / memory,
            "source_records_per_s": source,
            "raw_records_per_s": median(raws),
            "memory_records_per_s": memory,
            "p5_runs": [round(r, 3) for r in p5_runs],
            "p5c_runs": [round(s / m, 3)
                         for s, m in zip(source_rates, memory_rates, strict=True)],
            "source_records_per_s_runs": [round(s) for s in source_rates],
            "memory_records_per_s_runs": [round(m) for m in memory_rates],
            "source_cpu_us_per_record": source_cpu,
            "memory_cpu_us_per_record": memory_cpu,
            "prebuilt_records_per_s": median([c.rate for c in ceilings]),
            "prebuilt_cpu_us_per_record": median([c.machine_cpu_us for c in ceilings]),
            "p5_prebuilt": source / median([c.rate for c in ceilings]),
        })
        broker_cpus = [c.broker_cpu_us for c in sources if c.broker_cpu_us is not None]
        if broker_cpus:
            broker_cpu = median(broker_cpus)
            figures.update({
                "broker_cpu_us_per_record": broker_cpu,
                # Records per CPU-second of everything but the broker, the source over the
                # in-memory one: P5c as a broker on another machine would leave it, were the
                # query bound by CPU alone.
                "p5c_cpu_without_broker": memory_cpu / max(source_cpu - broker_cpu, 1e-9),
            })
    if p6:
        plain_rate = median([r.rate for r in plain])
        routed_rate = median([r.rate for r in routed])
        figures.update({
            "p6": routed_rate / plain_rate,
            "pipeline_routed_records_per_s": routed_rate,
            "pipeline_plain_records_per_s": plain_rate,
            "pipeline_routed_wall_s": median([r.wall_s for r in routed]),
            "pipeline_plain_wall_s": median([r.wall_s for r in plain]),
            "pipeline_batches": max(r.batches for r in plain + routed),
            "pipeline_first_batch_s": median([r.first_batch_s for r in plain + routed]),
            "pipeline_fixed_cost_s": fixed,
            "bare_query_records_per_s": bare,
            "routed_records": routed[0].routed,
            "p6_runs": [round(r.rate / p.rate, 3) for r, p in zip(routed, plain, strict=True)],
            "pipeline_broker_cpu_s_runs": {
                "no routing": [None if r.broker_cpu_s is None else round(r.broker_cpu_s, 1)
                               for r in plain],
                "routing": [None if r.broker_cpu_s is None else round(r.broker_cpu_s, 1)
                            for r in routed]},
            "pipeline_plain_wall_s_runs": [round(r.wall_s, 1) for r in plain],
            "pipeline_routed_wall_s_runs": [round(r.wall_s, 1) for r in routed],
        })
    if p8:
        frame_rate = median([r.rate for r in frames])
        function_rate = median([r.rate for r in routed])
        remote_rate = median([r.rate for r in remote])
        figures.update({
            "p8": frame_rate / median(plain_transforms),
            "p8_vs_function": frame_rate / function_rate,
            "connect": remote_rate / frame_rate,
            "frame_pipeline_records_per_s": frame_rate,
            "plain_transform_records_per_s": median(plain_transforms),
            "function_pipeline_records_per_s": function_rate,
            "connect_frame_pipeline_records_per_s": remote_rate,
            "p8_runs": [round(r.rate / t, 3) for r, t in zip(frames, plain_transforms,
                                                               strict=True)],
            "connect_runs": [round(r.rate / c.rate, 3) for r, c in zip(remote, frames,
                                                                        strict=True)],
            "frame_routed_records": frames[0].routed,
            "frame_wall_s": median([r.wall_s for r in frames]),
            "frame_steps_s": median_steps(frames),
            "connect_wall_s": median([r.wall_s for r in remote]),
            "connect_steps_s": median_steps(remote),
        })
        steady = [rate for r in frames if (rate := r.steady_rate) is not None]
        remote_steady = [rate for r in remote if (rate := r.steady_rate) is not None]
        if len(steady) == len(frames) and len(remote_steady) == len(remote):
            figures.update({
                "frame_steady_records_per_s": median(steady),
                "connect_steady_records_per_s": median(remote_steady),
                "connect_steady": median(remote_steady) / median(steady),
            })
    return figures


def median_steps(runs: Sequence[PipelineRun]) -> dict[str, float]:
    """Each batch step's median over the runs (seconds a run spent in it)."""
    names = sorted({name for run in runs for name in run.steps_s})
    return {name: round(median([run.steps_s.get(name, 0.0) for run in runs]), 2)
            for name in names}


def measure_connect(bench: Bench, workdir: Path, fail_per_10k: int, runs: int,
                    warm_topic: str) -> list[PipelineRun]:
    """The DataFrame-form pipeline on a Spark Connect session of a local Connect server (its
    own JVM on local[2], like the classic session's), after one warm-up run."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    say("starting a Spark Connect server ...")
    with ConnectServer(workdir / "connect", confs={
            "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"}) as server:
        session = ConnectSession.builder.remote(server.remote).create()
        try:
            register(session)
            bench.run_pipeline(fail_per_10k, topic=warm_topic, records=FIXED_COST_RECORDS,
                               form="transform", spark=session)
            remote = []
            for run in range(runs):
                say(f"connect run {run + 1}/{runs} ...")
                remote.append(bench.run_pipeline(fail_per_10k, form="transform",
                                                 spark=session))
        finally:
            session.stop()
    return remote


def table(figures: Mapping[str, Any], broker: str) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    p5, p6 = "p5" in figures, "p6" in figures
    lines = [
        f"date: {date}; {figures['records']:,} records of {VALUE_BYTES} bytes in {PARTITIONS} "
        f"partitions; {broker}; Spark local[2] on {os.cpu_count()} CPUs; "
        f"median of {figures['runs']} runs"
        + ("; Python workers with " + " ".join(f"{k}={v}" for k, v in MALLOC_KEPT.items())
           if figures["malloc_kept"] else ""),
        "",
        f"{'figure':<62}{'value':>12}{'goal':>10}",
    ]
    if p5:
        lines += [
            f"{'P5   redrive-kafka source count / raw consumer':<62}{figures['p5']:>12.3f}"
            f"{'>= ' + str(GOALS['p5']):>10}",
            f"{'P5c  redrive-kafka source count / in-memory Python source':<62}"
            f"{figures['p5c']:>12.3f}{'>= ' + str(GOALS['p5c']):>10}",
        ]
        if "p5c_cpu_without_broker" in figures:
            lines.append(f"{'     the same by CPU time, the broker left out':<62}"
                         f"{figures['p5c_cpu_without_broker']:>12.3f}")
        lines.append(f"{'     source / in-memory source yielding prebuilt batches':<62}"
                     f"{figures['p5_prebuilt']:>12.3f}")
    if p6:
        label = "P6   RetryPipeline routing {:g}% / no routing".format(figures["fail_rate"] * 100)
        lines.append(f"{label:<62}{figures['p6']:>12.3f}{'>= ' + str(GOALS['p6']):>10}")
    if "p8" in figures:
        for key, label in (("p8", "P8   DataFrame-form pipeline / plain transform query"),
                           ("p8_vs_function", "     DataFrame form / per-record function"),
                           ("connect", "     DataFrame form on Spark Connect / classic")):
            lines.append(f"{label:<62}{figures[key]:>12.3f}{'>= ' + str(GOALS[key]):>10}")
    lines += ["", f"{'measure':<62}{'records/s':>12}"]
    rows = [
        ("redrive-kafka batch read, count()", "source_records_per_s"),
        ("raw confluent-kafka consumer", "raw_records_per_s"),
        ("in-memory Python data source, count()", "memory_records_per_s"),
        ("in-memory source yielding prebuilt batches, count()", "prebuilt_records_per_s"),
        ("RetryPipeline, failures routed to retry topic (1h)", "pipeline_routed_records_per_s"),
        ("RetryPipeline, no failures", "pipeline_plain_records_per_s"),
        ("bare query: source, function step, one count per batch",
         "bare_query_records_per_s"),
        ("RetryPipeline, DataFrame form, failures routed", "frame_pipeline_records_per_s"),
        ("the same on Spark Connect", "connect_frame_pipeline_records_per_s"),
        ("plain query: source, transform, no-op sink", "plain_transform_records_per_s"),
        ("RetryPipeline, per-record function, failures routed",
         "function_pipeline_records_per_s"),
    ]
    lines += [f"{label:<62}{figures[key]:>12,.0f}" for label, key in rows if key in figures]
    lines.append("")
    if p6:
        lines += [
            f"pipeline wall time: {figures['pipeline_plain_wall_s']:.1f} s without routing, "
            f"{figures['pipeline_routed_wall_s']:.1f} s with {figures['routed_records']:,} "
            f"records routed; {figures['pipeline_batches']} micro-batch(es) per run; "
            f"query start to first batch done {figures['pipeline_first_batch_s']:.1f} s",
            f"pipeline fixed cost per query (start + one {FIXED_COST_RECORDS:,}-record batch): "
            f"{figures['pipeline_fixed_cost_s']:.1f} s",
        ]
    if "connect_steady" in figures:
        lines.append(
            f"DataFrame form after its first batch (the query's start left out): "
            f"{figures['frame_steady_records_per_s']:,.0f} records/s classic, "
            f"{figures['connect_steady_records_per_s']:,.0f} on Spark Connect, "
            f"ratio {figures['connect_steady']:.3f}")
    for form, prefix in (("classic", "frame"), ("Spark Connect", "connect")):
        if f"{prefix}_steps_s" in figures:
            steps = figures[f"{prefix}_steps_s"]
            wall = figures[f"{prefix}_wall_s"]
            lines.append(
                f"DataFrame form on {form}: a run's {wall:.1f} s = "
                + " + ".join(f"{name} {seconds:.1f}" for name, seconds in steps.items())
                + f" + outside the batch body {wall - sum(steps.values()):.1f} (medians, s)")
    runs = [f"{name} {figures[key]}" for name, key in
            (("P5", "p5_runs"), ("P5c", "p5c_runs"), ("P6", "p6_runs"), ("P8", "p8_runs"),
             ("connect", "connect_runs")) if key in figures]
    lines.append("per run: " + "  ".join(runs))
    if p5:
        lines.append(f"records/s per run: source {figures['source_records_per_s_runs']}, "
                     f"in-memory {figures['memory_records_per_s_runs']}")
        broker_cpu = figures.get("broker_cpu_us_per_record")
        lines.append(f"CPU time of the whole machine per record (us): source "
                     f"{figures['source_cpu_us_per_record']:.2f}"
                     + (f" (of it the broker {broker_cpu:.2f})" if broker_cpu is not None else "")
                     + f", in-memory {figures['memory_cpu_us_per_record']:.2f}"
                     + f", prebuilt {figures['prebuilt_cpu_us_per_record']:.2f}")
    if p6:
        lines.append("pipeline wall s per run: no routing "
                     f"{figures['pipeline_plain_wall_s_runs']}, "
                     f"routing {figures['pipeline_routed_wall_s_runs']}")
        cpu = figures["pipeline_broker_cpu_s_runs"]
        lines.append(f"broker CPU s per pipeline run: no routing {cpu['no routing']}, "
                     f"routing {cpu['routing']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="use this cluster instead of starting noida-db")
    parser.add_argument("--quick", action="store_true", help="100k records instead of 1M")
    parser.add_argument("--records", type=int, help="records to fill the topic with")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--fail-rate", type=float, default=0.05,
                        help="share of records the routed pipeline's function fails")
    parser.add_argument("--max-offsets", type=int,
                        help="maxOffsetsPerTrigger of the pipelines (default: all records)")
    parser.add_argument("--only", choices=("p5", "p6", "p8"),
                        help="measure only these figures (P5 and P5c, P6, or P8 and connect)")
    parser.add_argument("--malloc-kept", action="store_true",
                        help="run Spark's Python workers with " + " ".join(
                            f"{k}={v}" for k, v in MALLOC_KEPT.items()))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    records = args.records or (100_000 if args.quick else 1_000_000)
    if records < PARTITIONS or args.runs < 1 or not 0 < args.fail_rate < 1:
        parser.error("need --records >= 2, --runs >= 1 and 0 < --fail-rate < 1")
    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60.0)
    try:
        figures = measure(broker.bootstrap if broker is not None else args.bootstrap,
                          records, args.runs, round(args.fail_rate * 10_000),
                          args.max_offsets or records, args.only,
                          broker.pid if broker is not None else None, args.malloc_kept)
    finally:
        if broker is not None:
            broker.close()
    print(table(figures, "noida-db 0.2.3" if broker is not None else "external cluster"))
    if args.json:
        keys = ("p5", "p5c", "p6", "p8", "p8_vs_function", "connect", "source_records_per_s",
                "raw_records_per_s")
        print(json.dumps({**dict.fromkeys(keys), **figures}))


if __name__ == "__main__":
    main()
