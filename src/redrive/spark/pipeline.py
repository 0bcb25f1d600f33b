"""RetryPipeline: a Structured Streaming query with non-blocking retries and a dead-letter topic.

One query reads the main topic(s) and the group's retry topics through the `redrive-kafka` source
(which holds back records not yet due). Each micro-batch is handled by `batches.BatchBody`: the
user's per-record function, pandas batch function or DataFrame transform (a function or a SQL
query) decides each record's outcome, successes go to the sink, failures to their retry or
dead-letter topics with delivery confirmation, and only then does Spark commit the batch. The
body reports each batch through the batch ledger, which `run()` reads into the pipeline's stats
and metrics: the same path on a classic session and on Spark Connect, where the body runs in the
server's Python process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from redrive import control, gate, kafka, topics
from redrive.arguments import check_function, check_instance, check_int, check_seconds
from redrive.backends import RetryBackend
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError
from redrive.kafka.admin import partition_offsets
from redrive.kafka.health import BrokerHealth
from redrive.kafka.ranges import PartitionRange, heads
from redrive.metrics import Metrics
from redrive.policy import RetryPolicy
from redrive.signals import stop_on_signals
from redrive.spark import ledger, tasks
from redrive.spark.batches import BatchBody, Sink, Transform
from redrive.spark.brake import QueryBrake, tripped
from redrive.spark.failures import check_transform_output
from redrive.spark.outcomes import OK, RETRY, SKIPPED, BatchReport, PipelineStats
from redrive.spark.sql import SqlTransform, is_remote
from redrive.spark.stream import Starting, Subscription, starting_option, warn_if_speculative

log = logging.getLogger("redrive.spark")

# How long reading the heads of the retry partitions (for the gauges) may make no progress.
_HEAD_WAIT_S = 3.0
# How often a braked pipeline reads the control topic for its release.
_RELEASE_POLL_S = 1.0


def check_local_sink(sink: str, default_fs: str) -> None:
    """A sink path on this machine's file system (file:, or no scheme where Hadoop's default
    file system is the local one) that cannot be made fails here, naming it, not after the
    first batch as a long Hadoop trace. Other file systems (s3a:, hdfs:, a cluster's default)
    answer for themselves; a Connect server's files are not this machine's."""
    if "/" not in sink and ":" not in sink:
        return  # a table
    scheme = re.match(r"([A-Za-z][\w+.-]*):", sink)
    if (scheme.group(1) if scheme else default_fs.partition(":")[0]).lower() != "file":
        return
    path = Path(re.sub(r"^file:(//)?", "", sink)).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidArgument("sink", sink, f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidArgument("sink", sink, f"{existing} is not writable by this process")


class RetryPipeline:
    def __init__(
        self,
        spark: Any,
        connection: kafka.Connection,
        topics_: str | Sequence[str],
        group: str,
        policy: RetryPolicy,
        *,
        sink: Sink,
        checkpoint: str,
        output_schema: Any = None,
        function: tasks.RecordFunction | None = None,
        batch_function: tasks.BatchFunction | None = None,
        transform: Transform | str | None = None,
        error_column: str = "error",
        sink_format: str = "parquet",
        trigger_interval: str | None = None,
        available_now: bool = False,
        starting_offsets: Starting = "earliest",
        max_offsets_per_trigger: int | None = None,
        fail_on_data_loss: bool = True,
        metrics_port: int | None = None,
        on_batch: Callable[[int, PipelineStats], None] | None = None,
        retry_backend: RetryBackend | None = None,
        waiting_gauges_every_s: float = 10.0,
    ) -> None:
        from pyspark.sql.types import StructType

        if isinstance(transform, str):
            transform = SqlTransform(transform)
        forms = {"function": (function, "a record's mapping"),
                 "batch_function": (batch_function, "a pandas DataFrame"),
                 "transform": (transform, "a DataFrame")}
        given = [name for name, (value, _) in forms.items() if value is not None]
        if len(given) != 1:
            raise InvalidArgument("function", given or None,
                                  "give exactly one of function= (per record), batch_function= "
                                  "(per pandas batch) or transform= (a DataFrame transform)")
        check_function(given[0], forms[given[0]][0], forms[given[0]][1])
        if not isinstance(checkpoint, str) or not checkpoint:
            raise InvalidArgument("checkpoint", checkpoint, "must be the query's checkpoint "
                                  "location, a path or URL")
        if not (callable(sink) or (isinstance(sink, str) and sink)):
            raise InvalidArgument("sink", sink, "must be a path or table name, or callable "
                                  "with (DataFrame, batch_id)")
        if max_offsets_per_trigger is not None:
            check_int("max_offsets_per_trigger", max_offsets_per_trigger, 1, 2**63 - 1)
        check_seconds("waiting_gauges_every_s", waiting_gauges_every_s)
        for name, flag in (("available_now", available_now),
                           ("fail_on_data_loss", fail_on_data_loss)):
            check_instance(name, flag, bool, "True or False")
        if on_batch is not None and not callable(on_batch):
            raise InvalidArgument("on_batch", on_batch, "must be callable with (batch_id, "
                                  "PipelineStats)")
        if available_now and trigger_interval is not None:
            raise InvalidArgument("trigger_interval", trigger_interval,
                                  "an available_now run has no interval: it reads what is there "
                                  "and stops; give one or the other")
        self.spark = spark
        self.subscription = Subscription(connection, topics_, group, policy, retry_backend,
                                         fail_on_data_loss=fail_on_data_loss)
        self.connection = connection
        self.main_topics = self.subscription.main_topics
        self.group = self.subscription.group
        ledger.ledger_topic(self.group)  # a group too long for it is refused before anything runs
        self.policy = policy
        self.plans = self.subscription.plans
        self.remote = is_remote(spark)
        if transform is not None:
            if policy.in_place is not None:
                raise InvalidArgument("policy.in_place", policy.in_place,
                                      "a DataFrame transform runs in the JVM, where nothing can "
                                      "retry one row in place; drop in_place or use function=")
            self.output_schema = None
        else:
            # Parsed by the session's own Spark: a Connect client has no local parser.
            self.output_schema = (spark.createDataFrame([], output_schema).schema
                                  if isinstance(output_schema, str) else output_schema)
            if not isinstance(self.output_schema, StructType):
                raise InvalidArgument("output_schema", output_schema,
                                      "must be a StructType or DDL")
        if self.remote and not self.subscription.topics_backend:
            raise InvalidArgument("retry_backend", self.subscription.retry_backend,
                                  "a backend deciding on the driver needs a classic session; "
                                  "on Spark Connect use retry topics")
        if isinstance(sink, str) and not self.remote:
            check_local_sink(sink, str(spark.sparkContext._jsc.hadoopConfiguration().get(
                "fs.defaultFS")))
        self.sink = sink
        self.sink_format = sink_format
        self.checkpoint = checkpoint
        self.function = function
        self.batch_function = batch_function
        self.transform = transform
        self.error_column = error_column
        self.trigger_interval = trigger_interval or "1 second"
        self.available_now = available_now
        starting_option(starting_offsets)  # a bad value is refused here rather than at run()
        self.starting_offsets = starting_offsets
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.on_batch = on_batch
        self._waiting_every_s = waiting_gauges_every_s
        self._waiting_next = 0.0
        self.stats = PipelineStats()
        self.metrics = Metrics("spark", self.group)
        self.health = BrokerHealth(f"pipeline {self.group}", self.metrics)
        if metrics_port is not None:
            self.metrics.serve(metrics_port)
        self._query: Any = None
        self._stopping = threading.Event()
        self._running = False
        self._partitions: dict[str, int] = {}
        self._follower: ledger.Follower | None = None

    # --- set-up ------------------------------------------------------------------------------

    def ensure_topics(self) -> None:
        """Create what the retry backend needs (by default the retry and dead-letter topics) and
        the pipeline's batch ledger."""
        self._partitions = self.subscription.ensure_topics()
        name = ledger.ledger_topic(self.group)
        if name not in self._partitions:
            kafka.create_topics(kafka.admin(self.connection), {name: 1})
            self._partitions[name] = 1

    @property
    def consumed_topics(self) -> list[str]:
        return self.subscription.consumed_topics

    def source_options(self) -> dict[str, str]:
        return self.subscription.source_options(self.starting_offsets,
                                                self.max_offsets_per_trigger)

    def stream(self) -> Any:
        """The source's streaming DataFrame; the DataFrame form's carries the `redrive` column."""
        from redrive.spark.source import register

        if self.transform is not None:
            return self.subscription.stream(self.spark, self.starting_offsets,
                                            self.max_offsets_per_trigger)
        register(self.spark)
        return self.spark.readStream.format("redrive-kafka").options(
            **self.source_options()).load()

    def body(self) -> BatchBody:
        """The foreachBatch body, holding only what it needs, so Spark Connect can ship it."""
        connection = self.connection if isinstance(self.connection, str) else dict(
            self.connection)
        limit = self.policy.dead_letter_limit
        return BatchBody(
            connection=connection,
            group=self.group, policy=self.policy, route_policy=self.subscription.route_policy,
            sink=self.sink, sink_format=self.sink_format, checkpoint=self.checkpoint,
            partitions=dict(self._partitions),
            destinations=tuple(self.subscription.destinations),
            topics=tuple(self.subscription.consumed_topics),
            function=self.function, batch_function=self.batch_function,
            transform=self.transform, output_schema=self.output_schema,
            error_column=self.error_column,
            backend=None if self.subscription.topics_backend else self.subscription.backend,
            brake=None if limit is None else QueryBrake(limit, self.group, connection))

    def processed(self, frame: Any) -> Any:
        """The batch with each record's outcome (the per-record and pandas forms)."""
        return self.body()._processed(frame, {})

    # --- the query ---------------------------------------------------------------------------

    def start(self) -> Any:
        self.ensure_topics()
        warn_if_speculative(self.spark, self.group)
        frame = self.stream()
        if self.transform is not None:
            self._check_transform(frame)
        self._close_follower()
        self._follower = ledger.Follower(self.connection, ledger.ledger_topic(self.group))
        writer = (frame.writeStream.foreachBatch(self.body())
                  .option("checkpointLocation", self.checkpoint)
                  .queryName(f"redrive-{self.group}"))
        writer = (writer.trigger(availableNow=True) if self.available_now
                  else writer.trigger(processingTime=self.trigger_interval))
        self._query = writer.start()
        return self._query

    def _check_transform(self, frame: Any) -> None:
        """Fail at start, not at the first batch with a failure, on a transform returning no
        error column, one of the wrong type, or no record identity: its output schema is known
        without running it."""
        assert self.transform is not None
        empty = self.spark.createDataFrame([], frame.schema)
        check_transform_output(self.transform(empty), self.error_column)

    # --- what each batch reported ------------------------------------------------------------

    def _read_reports(self) -> None:
        """Count the batches the body reported since the last look, in order."""
        if self._follower is None:
            return
        try:
            entries = self._follower.new_entries()
        except (KafkaException, RedriveError) as exc:
            # The brokers are away: whether the query can go on is Spark's to say (run() raises
            # its error). The reports wait in the ledger, read from where the follower got to.
            self.health.trouble(str(exc))
            return
        self.health.ok()
        for entry in entries:
            if entry.state == ledger.DONE and entry.report.get("checkpoint") == self.checkpoint:
                self._count(BatchReport.from_dict(entry.report))

    def _count(self, report: BatchReport) -> None:
        self.stats.add(report)
        for row in report.outcomes:
            main = self._main(row.topic)
            if row.status == OK:
                self.metrics.processed(main, row.n)
            elif row.status == SKIPPED:
                self.metrics.skipped(main, row.skip_reason or "", row.n)
        for route in report.routes:
            if route.kind == RETRY:
                self.metrics.retried(self._main(route.topic or ""), route.attempt, route.n)
            elif route.topic is not None:
                self.metrics.dead_lettered(self._main(route.topic), route.reason or "",
                                           route.n)
        for took in report.handler_us:
            self.metrics.handler_took(took / 1_000_000)
        for late in report.late_s:
            self.metrics.late_by(late)
        for step, seconds in report.steps:
            self.metrics.batch_step_took(step, seconds)
        self._observe_waiting()
        if self.on_batch is not None:
            self.on_batch(report.batch, self.stats)

    def _observe_waiting(self) -> None:
        """Gauges of retry partitions held at a record not yet due, and the oldest such record.

        The source holds them in Spark's own source process, out of this driver's reach, so they
        are read off Kafka as `redrive stats` does: the record at the group's committed offset.
        """
        if not self.subscription.topics_backend or time.monotonic() < self._waiting_next:
            return
        self._waiting_next = time.monotonic() + self._waiting_every_s
        try:
            held, oldest = waiting_retries(self.connection, self.plans, self.group)
        except (KafkaException, RedriveError) as exc:
            log.warning("pipeline %s: could not read its retry partitions: %s", self.group, exc)
            return
        self.metrics.paused_partitions(held)
        self.metrics.oldest_pending_retry_since(oldest)

    def _main(self, topic: str) -> str:
        return self.subscription.main_of.get(topic, topic)

    # --- running and stopping ----------------------------------------------------------------

    def run(self, *, until: Callable[[PipelineStats], bool] | None = None,
            timeout_s: float | None = None, poll_s: float = 0.2) -> PipelineStats:
        """Run until `until(stats)` holds, the timeout passes, stop() is called or SIGTERM; an
        `available_now` pipeline also stops once it has read what its topics held at the start.

        On SIGTERM the pipeline lets the batch in progress finish before stopping the query; a
        batch Spark began right after it is cut, and runs again from the checkpoint at the next
        start, where the batch ledger keeps it from writing or copying twice. An error leaving
        the loop (from `until` or `on_batch`) stops the query too: on Spark Connect it would
        go on in the server, with no one to stop it.

        Run again once it returned (a scheduled job's next run), it starts a new query from the
        checkpoint, and `stats` then count that run alone.
        """
        query = self._query
        if query is None or not query.isActive:
            if query is not None:  # the last run's query ended: this is a new run
                self.stats = PipelineStats()
                self._stopping.clear()
            query = self.start()
        self._running = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def ending() -> bool:
            return ((until is not None and until(self.stats))
                    or (deadline is not None and time.monotonic() > deadline))

        try:
            with stop_on_signals(self._stopping.set):
                while True:
                    try:
                        while query.isActive:
                            self._read_reports()
                            if ending() or self._stopping.wait(poll_s):
                                break
                    except BaseException:
                        # An error leaving the loop (until= or on_batch= raising, an interrupt)
                        # must not leave the query running: on Spark Connect it runs in the
                        # server and outlives this process, with no one to read its reports
                        # or stop it.
                        with contextlib.suppress(Exception):
                            query.stop()
                        raise
                    self._stop_between_batches(query)
                    self._read_reports()
                    if query.exception() is None or not self._braked():
                        break
                    if not self._wait_for_release(ending, poll_s):
                        return self.stats  # stopped while braked: the stop stands
                    query = self.start()
            if query.exception() is not None:
                raise query.exception()
        finally:
            self._running = False
            self._close_follower()
        return self.stats

    def _braked(self) -> bool:
        """Whether the query ended because the dead-letter brake stopped partitions of the
        group (see spark.brake): counted, and logged with the command that releases them."""
        if self.policy.dead_letter_limit is None:
            return False
        try:
            standing = control.standing_stops(self.connection, self.group)
        except (KafkaException, RedriveError) as exc:
            log.warning("pipeline %s: the control topic could not be read (%s) after the query "
                        "failed", self.group, exc)
            return False
        if not standing.active:
            return False
        for stop in standing.active:
            self.metrics.brake_tripped(stop.topic)
        self.metrics.braked_partitions(len(standing.active))
        then = ("until resumed" if self.policy.dead_letter_limit.cool_off_ms is None
                else "until resumed or the cool-off ends")
        log.warning("pipeline %s: %s; waiting %s", self.group,
                    tripped(self.connection, self.group, standing.active), then)
        return True

    def _wait_for_release(self, ending: Callable[[], bool], poll_s: float) -> bool:
        """Wait for the group's stops to be released: True, or False once run() must end."""
        while not (ending() or self._stopping.wait(max(poll_s, _RELEASE_POLL_S))):
            try:
                standing = control.standing_stops(self.connection, self.group)
            except (KafkaException, RedriveError) as exc:
                self.health.trouble(str(exc))
                continue
            self.health.ok()
            if not standing.active:
                self.metrics.braked_partitions(0)
                log.warning("pipeline %s: the dead-letter brake's stops were released; the "
                            "query starts again from its checkpoint", self.group)
                return True
        return False

    def stop(self) -> None:
        """Stop between batches; when run() is looping, it sees the flag and stops itself."""
        self._stopping.set()
        if self._query is not None and not self._running:
            self._stop_between_batches(self._query)
            self._close_follower()

    def _close_follower(self) -> None:
        if self._follower is not None:
            self._follower.close()
            self._follower = None

    def _stop_between_batches(self, query: Any, wait_s: float = 120.0) -> None:
        """Stop at once when no batch runs; else as soon as the batch running when asked has
        committed (a new progress is reported). A busy query (a backlog: each batch longer
        than the trigger interval) starts its next batch at once and is never seen with no
        trigger active, so waiting for that waited the whole wait_s and then cut a batch
        anyway. A batch cut short runs again from the checkpoint; the ledger keeps it from
        writing or copying twice."""
        deadline = time.monotonic() + wait_s
        first: Any = ()
        while query.isActive and time.monotonic() < deadline:
            if not query.status.get("isTriggerActive"):
                break
            progress = query.lastProgress
            seen = None if progress is None else progress["batchId"]
            if first == ():
                first = seen
            elif seen != first:
                break  # the batch that was running has committed
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

