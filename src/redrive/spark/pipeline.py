"""RetryPipeline: a Structured Streaming query with non-blocking retries and a dead-letter topic.

One query reads the main topic(s) and the group's retry topics through the `redrive-kafka` source
(which holds back records not yet due). Executors run the user's function on each record and catch
its error; errors the policy marks in-place are retried there first. In foreachBatch the successes
go to the user's sink, and the failures are routed (on executors, with the pure `route`) to the
retry and dead-letter topics with delivery confirmation. Only then does Spark commit the batch, so
a crash replays it: nothing is lost, and a replayed batch's copies carry their original
topic/partition/offset and attempt, so duplicates are recognisable.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from redrive import kafka, topics
from redrive.errors import InvalidPolicy
from redrive.metrics import Metrics
from redrive.policy import RetryPolicy
from redrive.spark import tasks
from redrive.spark.outcomes import PipelineStats
from redrive.spark.writer import write_to_kafka

Sink = Callable[[Any, int], None] | str
# Lateness is observed for at most this many retried records per batch: enough for quantiles.
_LATENESS_SAMPLE = 2_000


class RetryPipeline:
    def __init__(
        self,
        spark: Any,
        connection: kafka.Connection,
        topics_: str | Sequence[str],
        group: str,
        policy: RetryPolicy,
        *,
        output_schema: Any,
        sink: Sink,
        checkpoint: str,
        function: tasks.RecordFunction | None = None,
        batch_function: tasks.BatchFunction | None = None,
        error_column: str = "error",
        sink_format: str = "parquet",
        trigger_interval: str = "1 second",
        starting_offsets: str = "earliest",
        max_offsets_per_trigger: int | None = None,
        metrics_port: int | None = None,
        on_batch: Callable[[int, PipelineStats], None] | None = None,
    ) -> None:
        from pyspark.sql.types import StructType

        if (function is None) == (batch_function is None):
            raise InvalidPolicy("function", (function, batch_function),
                                "give exactly one of function= (per record) or batch_function=")
        self.spark = spark
        self.connection = connection
        self.main_topics = [topics_] if isinstance(topics_, str) else list(topics_)
        if not self.main_topics:
            raise InvalidPolicy("topics", topics_, "name at least one topic")
        self.group = topics.check_name("group", group)
        self.policy = policy
        self.output_schema = (StructType.fromDDL(output_schema) if isinstance(output_schema, str)
                              else output_schema)
        if not isinstance(self.output_schema, StructType):
            raise InvalidPolicy("output_schema", output_schema, "must be a StructType or DDL")
        self.sink = sink
        self.sink_format = sink_format
        self.checkpoint = checkpoint
        self.function = function
        self.batch_function = batch_function
        self.error_column = error_column
        self.trigger_interval = trigger_interval
        self.starting_offsets = starting_offsets
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.on_batch = on_batch
        self.plans = topics.plans(policy, self.main_topics, self.group)
        self.stats = PipelineStats()
        self.metrics = Metrics("spark", self.group)
        if metrics_port is not None:
            self.metrics.serve(metrics_port)
        self._query: Any = None
        self._stopping = threading.Event()
        self._running = False
        self._partitions: dict[str, int] = {}

    # --- set-up ------------------------------------------------------------------------------

    def ensure_topics(self) -> None:
        """Create the retry and dead-letter topics, with the main topic's partition count."""
        admin = kafka.admin(self.connection)
        for plan in self.plans.values():
            topics.ensure_topics(admin, plan)
        self._partitions = kafka.topic_partitions(admin)

    @property
    def consumed_topics(self) -> list[str]:
        return [name for plan in self.plans.values() for name in plan.consumed_topics]

    def source_options(self) -> dict[str, str]:
        config = kafka.client_config(self.connection)
        options = {f"kafka.{key}": str(value) for key, value in config.items()}
        options.update({
            "subscribe": ",".join(self.consumed_topics),
            "startingOffsets": self.starting_offsets,
            "includeHeaders": "true",
            "redrive.group": self.group,
            # Only retry copies carry due times; scanning the main topics would only cost.
            "redrive.gatedTopics": ",".join(name for plan in self.plans.values()
                                            for name in plan.retry_topic_names),
        })
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options

    def stream(self) -> Any:
        from redrive.spark.source import register

        register(self.spark)
        return self.spark.readStream.format("redrive-kafka").options(
            **self.source_options()).load()

    # --- the query ---------------------------------------------------------------------------

    def start(self) -> Any:
        self.ensure_topics()
        frame = self.stream()
        writer = (frame.writeStream.foreachBatch(self._handle_batch)
                  .option("checkpointLocation", self.checkpoint)
                  .queryName(f"redrive-{self.group}")
                  .trigger(processingTime=self.trigger_interval))
        self._query = writer.start()
        return self._query

    def processed(self, frame: Any) -> Any:
        """The batch with each record's outcome: status, error columns and the user's output."""
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import (
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        spark_types = {"status": StringType(), "attempt": IntegerType(), "due_ms": LongType(),
                       "handled_ms": LongType(), "in_place": IntegerType()}
        extra = [StructField(name, spark_types.get(name, StringType()))
                 for name, _ in tasks.STATUS_COLUMNS]
        schema = StructType([*frame.schema.fields, *extra,
                             StructField("output", self.output_schema)])
        body = partial(tasks.process_batches, record_function=self.function,
                       batch_function=self.batch_function, error_column=self.error_column,
                       policy=self.policy, group=self.group,
                       output_type=to_arrow_type(self.output_schema))
        return frame.mapInArrow(body, schema)

    def _handle_batch(self, frame: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        processed = self.processed(frame).persist()
        try:
            self._write_sink(processed.where(F.col("status") == tasks.OK).select("output.*"),
                             batch_id)
            failed, with_due = self._count_processed(processed)
            if failed:
                self._route_failures(processed.where(F.col("status") == tasks.FAILED))
            if with_due:
                self._observe_lateness(processed)
        finally:
            processed.unpersist()
        self.stats.batches += 1
        if self.on_batch is not None:
            self.on_batch(batch_id, self.stats)

    def _route_failures(self, failed: Any) -> None:
        """Copy failed records to their retry or dead-letter topic; raise unless all confirmed."""
        from pyspark.sql import functions as F

        routed = failed.mapInArrow(
            partial(tasks.route_batches, policy=self.policy, group=self.group,
                    partitions=dict(self._partitions)),
            _routed_schema()).persist()
        try:
            write_to_kafka(routed.where(F.col("topic").isNotNull())
                           .select("topic", "key", "value", "headers", "partition"),
                           self.connection)
            self._count_routed(routed)
        finally:
            routed.unpersist()

    def _write_sink(self, successes: Any, batch_id: int) -> None:
        if callable(self.sink):
            self.sink(successes, batch_id)
        elif "/" in self.sink or ":" in self.sink:
            successes.write.mode("append").format(self.sink_format).save(self.sink)
        else:
            successes.write.mode("append").format(self.sink_format).saveAsTable(self.sink)

    def _count_processed(self, processed: Any) -> tuple[int, int]:
        """Count the batch's outcomes; return how many failed, and how many had a due time."""
        from pyspark.sql import functions as F

        early = F.when(F.col("due_ms").isNotNull() & (F.col("handled_ms") < F.col("due_ms")), 1)
        rows = (processed.groupBy("status", "attempt", "topic")
                .agg(F.count(F.lit(1)).alias("n"), F.count(early).alias("early"),
                     F.sum("in_place").alias("in_place"), F.count("due_ms").alias("due"))
                .collect())
        stats, failed, with_due = self.stats, 0, 0
        for row in rows:
            with_due += row["due"]
            stats.records += row["n"]
            stats.early += row["early"]
            stats.in_place_retries += row["in_place"] or 0
            if row["status"] == tasks.OK:
                stats.succeeded_by_retries[row["attempt"]] += row["n"]
                self.metrics.processed(row["topic"], row["n"])
            elif row["status"] == tasks.SKIPPED:
                stats.skipped += row["n"]
                self.metrics.skipped(row["topic"], "other-group", row["n"])
            else:
                failed += row["n"]
        return failed, with_due

    def _count_routed(self, routed: Any) -> None:
        stats = self.stats
        for row in routed.groupBy("kind", "reason", "attempt", "topic").count().collect():
            if row["kind"] == "retry":
                self.metrics.retried(row["topic"], row["attempt"], row["count"])
                stats.retried_by_attempt[row["attempt"]] += row["count"]
            elif row["topic"] is None:
                stats.dropped_by_reason[row["reason"]] += row["count"]
            else:
                self.metrics.dead_lettered(row["topic"], row["reason"], row["count"])
                stats.dead_lettered_by_reason[row["reason"]] += row["count"]

    def _observe_lateness(self, processed: Any) -> None:
        from pyspark.sql import functions as F

        lateness = (processed.where(F.col("due_ms").isNotNull())
                    .select(((F.col("handled_ms") - F.col("due_ms")) / 1000).alias("late"))
                    .limit(_LATENESS_SAMPLE).collect())
        for row in lateness:
            self.metrics.late_by(row["late"])

    # --- running and stopping ----------------------------------------------------------------

    def run(self, *, until: Callable[[PipelineStats], bool] | None = None,
            timeout_s: float | None = None, poll_s: float = 0.5) -> PipelineStats:
        """Run until `until(stats)` holds, the timeout passes, stop() is called or SIGTERM.

        On SIGTERM the pipeline lets the batch in progress finish before stopping the query, so
        the checkpoint and the Kafka commits stay in step.
        """
        query = self._query or self.start()
        self._running = True
        previous = _install_sigterm(self._stopping)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while query.isActive:
                if until is not None and until(self.stats):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    break
                if self._stopping.is_set():
                    break
                time.sleep(poll_s)
            self._stop_between_batches(query)
            if query.exception() is not None:
                raise query.exception()
        finally:
            self._running = False
            _restore_sigterm(previous)
        return self.stats

    def stop(self) -> None:
        """Stop between batches; when run() is looping, it sees the flag and stops itself."""
        self._stopping.set()
        if self._query is not None and not self._running:
            self._stop_between_batches(self._query)

    def _stop_between_batches(self, query: Any, wait_s: float = 120.0) -> None:
        deadline = time.monotonic() + wait_s
        while query.isActive and query.status.get("isTriggerActive") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()


def _routed_schema() -> Any:
    from pyspark.sql.types import StructType

    return StructType.fromDDL(
        "topic string, key binary, value binary, "
        "headers array<struct<key:string,value:binary>>, partition int, kind string, "
        "reason string, attempt int")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install_sigterm(flag: threading.Event) -> Any:
    if not _on_main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda *_: flag.set())


def _restore_sigterm(previous: Any) -> None:
    if previous is not None and _on_main_thread():
        signal.signal(signal.SIGTERM, previous)

