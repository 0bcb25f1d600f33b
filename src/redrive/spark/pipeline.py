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

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from redrive import gate, kafka, topics
from redrive import headers as h
from redrive.backends import RetryBackend, RetryTopics, Verdict
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, MalformedHeader, RedriveError
from redrive.kafka.admin import partition_offsets
from redrive.kafka.ranges import PartitionRange, heads
from redrive.metrics import Metrics
from redrive.policy import RetryPolicy
from redrive.record import Record
from redrive.routing import DeadLetter, Retry, Route
from redrive.signals import stop_on_signals
from redrive.spark import tasks
from redrive.spark.outcomes import PipelineStats

log = logging.getLogger("redrive.spark")

Sink = Callable[[Any, int], None] | str
# Handler time and lateness are observed on at most this many records per batch: enough for
# quantiles.
_SAMPLE = 2_000
# How long reading the heads of the retry partitions (for the gauges) may make no progress.
_HEAD_WAIT_S = 3.0


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
        retry_backend: RetryBackend | None = None,
        waiting_gauges_every_s: float = 10.0,
    ) -> None:
        from pyspark.sql.types import StructType

        if (function is None) == (batch_function is None):
            raise InvalidArgument("function", (function, batch_function),
                                "give exactly one of function= (per record) or batch_function=")
        self.spark = spark
        self.connection = connection
        self.main_topics = [topics_] if isinstance(topics_, str) else list(topics_)
        if not self.main_topics:
            raise InvalidArgument("topics", topics_, "name at least one topic")
        self.group = topics.check_name("group", group)
        self.policy = policy
        self.output_schema = (StructType.fromDDL(output_schema) if isinstance(output_schema, str)
                              else output_schema)
        if not isinstance(self.output_schema, StructType):
            raise InvalidArgument("output_schema", output_schema, "must be a StructType or DDL")
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
        # Metrics are labelled by main topic, as in every runtime, whichever topic a record is on.
        self._main_of = {name: plan.topic for plan in self.plans.values()
                         for name in [*plan.consumed_topics, *plan.created_topics]}
        if retry_backend is not None and not isinstance(retry_backend, RetryBackend):
            raise InvalidArgument("retry_backend", retry_backend,
                                  "must be a RetryBackend (RetryTopics() or a StoreBackend)")
        self.retry_backend = retry_backend if retry_backend is not None else RetryTopics()
        self._backend = self.retry_backend.bind(self.group)
        if self._backend.sequential:
            raise InvalidArgument("retry_backend", self.retry_backend,
                                  "per-key ordering needs records handled one by one in order; "
                                  "a Spark batch handles them in parallel (use RetryingConsumer)")
        self._topics_backend = isinstance(self.retry_backend, RetryTopics)
        policies = {self._backend.policy_for(topic, policy) for topic in self.main_topics}
        if len(policies) > 1:
            raise InvalidArgument("retry_backend", self.retry_backend,
                                  "one pipeline routes with one policy; its topics have several")
        self.route_policy = policies.pop()
        self._producer: Any = None
        self._waiting_every_s = waiting_gauges_every_s
        self._waiting_next = 0.0
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
        """Create what the retry backend needs: by default the retry and dead-letter topics."""
        admin = kafka.admin(self.connection)
        for warning in self._backend.prepare(admin, self.plans):
            log.warning("pipeline %s: %s", self.group, warning)
        self._partitions = kafka.topic_partitions(admin)

    @property
    def consumed_topics(self) -> list[str]:
        return [name for plan in self.plans.values()
                for name in self._backend.consumed_topics(plan)]

    def source_options(self) -> dict[str, str]:
        config = kafka.client_config(self.connection)
        options = {f"kafka.{key}": str(value) for key, value in config.items()}
        options.update({
            "subscribe": ",".join(self.consumed_topics),
            "startingOffsets": self.starting_offsets,
            "includeHeaders": "true",
            "redrive.group": self.group,
        })
        gated = [name for name in self.consumed_topics if name not in self.main_topics]
        if self._topics_backend and gated:
            # Only retry copies carry due times; scanning the main topics would only cost.
            options["redrive.gatedTopics"] = ",".join(gated)
        else:
            # A store's scheduler publishes a copy only once it is due.
            options["redrive.gate"] = "false"
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

    def processed(self, frame: Any, skip: dict[tasks.Coordinates, str] | None = None) -> Any:
        """The batch with each record's outcome: status, error columns and the user's output."""
        from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
        from pyspark.sql.types import StructField, StructType

        extra = [StructField(name, from_arrow_type(kind)) for name, kind in tasks.STATUS_COLUMNS]
        schema = StructType([*frame.schema.fields, *extra,
                             StructField("output", self.output_schema)])
        body = partial(tasks.process_batches, record_function=self.function,
                       batch_function=self.batch_function, error_column=self.error_column,
                       policy=self.policy, group=self.group,
                       output_type=to_arrow_type(self.output_schema), skip=skip or {})
        return frame.mapInArrow(body, schema)

    def _handle_batch(self, frame: Any, batch_id: int) -> None:
        if self._topics_backend:
            self._handle(frame, batch_id, {})
        else:
            frame = frame.persist()
            try:
                self._handle(frame, batch_id, self._admit(frame))
                self._backend.flush()  # outcomes stored before Spark commits the batch
            except BaseException:
                self._backend.discard()
                raise
            finally:
                frame.unpersist()
        self.stats.batches += 1
        self._observe_waiting()
        if self.on_batch is not None:
            self.on_batch(batch_id, self.stats)

    def _handle(self, frame: Any, batch_id: int, skip: dict[tasks.Coordinates, str]) -> None:
        from pyspark.sql import functions as F

        processed = self.processed(frame, skip).persist()
        try:
            self._write_sink(processed.where(F.col("status") == tasks.OK).select("output.*"),
                             batch_id)
            failed = self._count_processed(processed)
            if failed:
                failures = (processed.where(F.col("status") == tasks.FAILED)
                            .select(*tasks.ROUTING_COLUMNS))
                if self._topics_backend:
                    self._route_failures(failures)
                else:
                    self._route_to_backend(failures)
            if not self._topics_backend:
                for record in _records(processed.where((F.col("status") == tasks.OK)
                                                       & _has_redrive())):
                    self._backend.succeeded(record)
            self._observe_samples(processed)
        finally:
            processed.unpersist()

    def _admit(self, frame: Any) -> dict[tasks.Coordinates, str]:
        """Ask the backend, in offset order, which copies it has already seen an outcome for."""
        refused: dict[tasks.Coordinates, str] = {}
        records = sorted(_records(frame.where(_has_redrive())),
                         key=lambda r: (r.topic, r.partition, r.offset))
        # Reached only with a backend other than retry topics: the store reads them all at once.
        self._backend.prefetch(records)
        for record in records:
            verdict = self._backend.admit(record)
            if verdict is not Verdict.PROCESS:
                refused[(record.topic, record.partition, record.offset)] = verdict.value
        return refused

    def _route_to_backend(self, failed: Any) -> None:
        """Route on executors, then hand each decision to the backend on the driver."""
        routed = failed.mapInArrow(
            partial(tasks.route_batches, policy=self.route_policy, group=self.group,
                    partitions=dict(self._partitions)),
            _routed_schema()).collect()
        copies: list[kafka.OutRecord] = []
        for row in routed:
            pairs = [(pair["key"], bytes(pair["value"])) for pair in row["headers"]]
            decision = _decision(row, pairs)
            record = Record(row["topic"] or "", -1, -1, -1, tasks.optional_bytes(row["key"]),
                            tasks.optional_bytes(row["value"]), pairs, h.read_delivery(pairs))
            copy = self._backend.failed(record, decision, self._partitions)
            if copy is not None:
                copies.append(copy)
            self._count_route(row["kind"], row["topic"], row["reason"], row["attempt"], 1)
        if copies:
            if self._producer is None:
                self._producer = kafka.producer(self.connection)
            kafka.produce_confirmed(self._producer, copies)

    def _route_failures(self, failed: Any) -> None:
        """Copy failed records to their retry or dead-letter topic; raise unless all confirmed."""
        from pyspark.sql.pandas.types import from_arrow_schema

        body = tasks.RouteAndProduce(self.route_policy, self.group, dict(self._partitions),
                                     self.connection if isinstance(self.connection, str)
                                     else dict(self.connection))
        for row in failed.mapInArrow(body, from_arrow_schema(tasks.ROUTE_COUNTS_SCHEMA)).collect():
            self._count_route(row["kind"], row["topic"], row["reason"], row["attempt"],
                              row["count"])

    def _write_sink(self, successes: Any, batch_id: int) -> None:
        if callable(self.sink):
            self.sink(successes, batch_id)
        elif "/" in self.sink or ":" in self.sink:
            successes.write.mode("append").format(self.sink_format).save(self.sink)
        else:
            successes.write.mode("append").format(self.sink_format).saveAsTable(self.sink)

    def _count_processed(self, processed: Any) -> int:
        """Count the batch's outcomes; return how many records failed and need routing."""
        from pyspark.sql import functions as F

        early = F.when(F.col("due_ms").isNotNull() & (F.col("handled_ms") < F.col("due_ms")), 1)
        rows = (processed.groupBy("status", "attempt", "topic", "skip_reason")
                .agg(F.count(F.lit(1)).alias("n"), F.count(early).alias("early"),
                     F.sum("in_place").alias("in_place"))
                .collect())
        stats, failed = self.stats, 0
        for row in rows:
            stats.records += row["n"]
            stats.early += row["early"]
            stats.in_place_retries += row["in_place"] or 0
            if row["status"] == tasks.OK:
                stats.succeeded_by_retries[row["attempt"]] += row["n"]
                self.metrics.processed(self._main(row["topic"]), row["n"])
            elif row["status"] == tasks.SKIPPED:
                stats.skipped += row["n"]
                self.metrics.skipped(self._main(row["topic"]), row["skip_reason"], row["n"])
            else:
                failed += row["n"]
        return failed

    def _count_route(self, kind: str, topic: str | None, reason: str | None, attempt: int,
                     count: int) -> None:
        stats = self.stats
        if kind == "retry":
            self.metrics.retried(self._main(topic or ""), attempt, count)
            stats.retried_by_attempt[attempt] += count
        elif topic is None:
            stats.dropped_by_reason[reason or ""] += count
        else:
            self.metrics.dead_lettered(self._main(topic), reason or "", count)
            stats.dead_lettered_by_reason[reason or ""] += count

    def _observe_waiting(self) -> None:
        """Gauges of retry partitions held at a record not yet due, and the oldest such record.

        The source holds them in Spark's own source process, out of this driver's reach, so they
        are read off Kafka as `redrive stats` does: the record at the group's committed offset.
        """
        if not self._topics_backend or time.monotonic() < self._waiting_next:
            return
        self._waiting_next = time.monotonic() + self._waiting_every_s
        try:
            held, oldest = waiting_retries(self.connection, self.plans, self.group)
        except RedriveError as exc:
            log.warning("pipeline %s: could not read its retry partitions: %s", self.group, exc)
            return
        self.metrics.paused_partitions(held)
        self.metrics.oldest_pending_retry(0.0 if oldest is None else (now_ms() - oldest) / 1000)

    def _main(self, topic: str) -> str:
        return self._main_of.get(topic, topic)

    def _observe_samples(self, processed: Any) -> None:
        """Handler times and lateness past due, from one sample of the batch (one Spark job)."""
        from pyspark.sql import functions as F

        late = ((F.col("handled_ms") - F.col("due_ms")) / 1000).alias("late")
        for row in (processed.where(F.col("handler_us").isNotNull() | F.col("due_ms").isNotNull())
                    .select("handler_us", late).limit(_SAMPLE).collect()):
            if row["handler_us"] is not None:
                self.metrics.handler_took(row["handler_us"] / 1_000_000)
            if row["late"] is not None:
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
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            with stop_on_signals(self._stopping.set):
                while query.isActive:
                    if until is not None and until(self.stats):
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        break
                    if self._stopping.wait(poll_s):
                        break
                self._stop_between_batches(query)
            if query.exception() is not None:
                raise query.exception()
        finally:
            self._running = False
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


def waiting_retries(connection: kafka.Connection, plans: Mapping[str, topics.TopicPlan],
                    group: str) -> tuple[int, int | None]:
    """How many retry partitions wait at a record not yet due, and the oldest waiting timestamp:
    the record at the group's committed offset of each retry partition."""
    counts = kafka.topic_partitions(kafka.admin(connection))
    retry = [(name, p) for plan in plans.values() for name in plan.retry_topic_names
             if name in counts for p in range(counts[name])]
    if not retry:
        return 0, None
    at = now_ms()
    consumer = kafka.consumer(connection, group)
    try:
        offsets = partition_offsets(consumer, retry)
    finally:
        consumer.close()
    found = heads(connection, [PartitionRange(t, p, o.resume, o.high)
                               for (t, p), o in offsets.items()], idle_s=_HEAD_WAIT_S)
    dues = [gate.due_of(record.headers) for record in found.values()]
    held = sum(1 for due in dues if due is not None and due > at)
    oldest = min((record.timestamp_ms for record in found.values()), default=None)
    return held, oldest


def _has_redrive() -> Any:
    from pyspark.sql import functions as F

    return F.exists("headers", lambda pair: pair["key"].startswith(h.PREFIX))


def _records(frame: Any) -> list[Record]:
    """Rows of the batch as Records, for the backend on the driver (malformed ones left out)."""
    records = []
    # The backend decides by coordinates, history and key: values stay on the executors.
    for row in frame.select("topic", "partition", "offset", "timestamp", "key",
                            "headers").collect():
        record = tasks.record_of(row.asDict())
        try:
            delivery = h.read_delivery(record.headers)
        except MalformedHeader:
            continue  # the executor step failed it as malformed; routing dead-letters it
        records.append(Record(record.topic, record.partition, record.offset,
                              record.timestamp_ms, record.key, record.value, record.headers,
                              delivery))
    return records


def _decision(row: Any, pairs: list[tuple[str, bytes]]) -> Route:
    if row["kind"] == "retry":
        return Retry(row["topic"], h.read_due(pairs) or 0, pairs, row["attempt"],
                     row["partition"])
    return DeadLetter(row["topic"], pairs, row["reason"], row["attempt"], row["partition"])


def _routed_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(tasks.ROUTED_SCHEMA)
