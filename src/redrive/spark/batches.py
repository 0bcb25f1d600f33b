"""What RetryPipeline does with each micro-batch: its foreachBatch body.

The body is a module-level frozen dataclass holding only data and the user's functions, so that
Spark Connect can pickle it to the server, where foreachBatch runs; it reports to the pipeline's
client through the batch ledger. Per batch: outcomes are computed (the user's function on the
executors, or the user's DataFrame transform in the JVM), successes are written to the sink keyed
by the batch id, failures are copied to their retry or dead-letter topics with delivery
confirmation, and only then does Spark commit the batch. A replayed batch (after a crash) writes
the same sink partition over, copies only what its first run did not, and reports nothing twice.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import ModuleType
from typing import Any

import pyarrow as pa

from redrive import headers as h
from redrive import kafka
from redrive.backends import BoundBackend, Verdict
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, MalformedHeader
from redrive.kafka.produce import producer_failed
from redrive.metrics import SKIPPED_OTHER_GROUP
from redrive.oversize import slimmed
from redrive.policy import RetryPolicy
from redrive.record import ErrorInfo, Record
from redrive.routing import DeadLetter, Retry, Route
from redrive.spark import ledger, poison, tasks
from redrive.spark.brake import QueryBrake
from redrive.spark.checkpoint import query_id
from redrive.spark.failures import IDENTITY, decide, fetch_rows, route_rows, routing_rows
from redrive.spark.outcomes import (
    DEAD_LETTER,
    FAILED,
    OK,
    RETRY,
    SAMPLE,
    SKIPPED,
    BatchReport,
    Outcomes,
    Routed,
    StepClock,
)
from redrive.spark.producers import cached_producer, drop_cached_producers
from redrive.spark.sql import error_set, functions, hold, lost_held_rows, quoted, release
from redrive.spark.tally import BatchTally

log = logging.getLogger("redrive.spark")

Sink = Callable[[Any, int], None] | str
Transform = Callable[[Any], Any]
# The columns of a path or table sink that key each row by the query and the batch that wrote
# it, so that a replayed batch overwrites its own rows instead of adding them again, and a new
# query's batch 0 (see spark.checkpoint) does not overwrite an earlier query's.
QUERY_COLUMN = "redrive_query"
BATCH_COLUMN = "redrive_batch"


@dataclass(frozen=True)
class BatchBody:
    connection: kafka.Connection
    group: str
    policy: RetryPolicy  # for in-place retries on the executors
    route_policy: RetryPolicy  # for routing (the backend's, if it has its own)
    sink: Sink
    sink_format: str
    checkpoint: str  # names the query in the ledger, with its id
    partitions: Mapping[str, int]
    destinations: tuple[str, ...]
    topics: tuple[str, ...] = ()  # the topics the query reads, for the DataFrame form's tally
    function: tasks.RecordFunction | None = None
    batch_function: tasks.BatchFunction | None = None
    transform: Transform | None = None
    output_schema: Any = None
    error_column: str = "error"
    # A store or other backend deciding on the driver; only with a classic session, where the
    # body is called in the client's own process and never pickled.
    backend: BoundBackend | None = field(default=None, compare=False)
    # The policy's dead-letter limit, judged before each batch's failures are copied.
    brake: QueryBrake | None = field(default=None, compare=False)
    # The query's id, read from its checkpoint at its first batch: a body serves one query.
    query: dict[str, str] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def ledger_topic(self) -> str:
        return ledger.ledger_topic(self.group)

    def _names(self) -> dict[str, str]:
        """What the ledger's entries name this query by."""
        return {"checkpoint": self.checkpoint, "query": self.query["id"]}

    def __call__(self, frame: Any, batch_id: int) -> None:
        taken: dict[str, int] = {}  # the marks this process took before it first copied
        try:
            self._handle(frame, batch_id, taken)
        except Exception as exc:
            if lost_held_rows(exc):
                # An executor holding part of the batch is gone: the batch runs again, its
                # rows persisted this time, which Spark can compute again if lost.
                log.warning("pipeline %s: batch %d: rows held for it were lost (%s); the batch "
                            "runs again, persisted", self.group, batch_id, exc)
                self._handle(frame, batch_id, taken, as_rows=False)
                return
            if not producer_failed(exc):
                raise
            # An idempotent producer fails for good when the broker loses its state (a broker
            # restart: OUT_OF_ORDER_SEQUENCE_NUMBER). Failing the batch would stop the query;
            # instead new producers run it again as Spark replays a batch: the ledger says
            # which copies were written, and the sink's write for this batch id is replaced.
            log.warning("pipeline %s: batch %d: a producer failed for good (%s); new producers "
                        "run the batch again", self.group, batch_id, exc)
            drop_cached_producers()
            self._handle(frame, batch_id, taken)

    def _handle(self, frame: Any, batch_id: int, taken: dict[str, int], *,
                as_rows: bool = True) -> None:
        clock = StepClock()
        # Made (or kept alive) now: a new producer's idempotent id takes 0.5-1 s to come, which
        # it then spends while the batch is written rather than before the batch's first
        # ledger entry (a Spark Connect query's foreachBatch process is new for each query).
        self._producer()
        if "id" not in self.query:
            self.query["id"] = query_id(frame.sparkSession, self.checkpoint)
        previous = ledger.last(self.connection, self.ledger_topic)
        clock.done("ledger")
        if previous is not None and previous.report.get("query") != self.query["id"]:
            previous = None  # another query's batches (a new checkpoint starts at 0 again)
        if previous is not None and previous.batch == batch_id and previous.state == ledger.DONE:
            log.info("pipeline %s: batch %d was handled before a restart", self.group, batch_id)
            return
        if self.brake is not None:
            self.brake.begin()  # a stop standing fails the batch before it writes anything
        resumed = previous if previous is not None and previous.batch == batch_id else None
        if resumed is None and taken:
            # An earlier attempt in this process marked the routing and began copying, and the
            # ledger lost the entry: a broker restarted without acknowledged writes (noida-db
            # keeps what it wrote out before a SIGKILL, topic by topic, so copies may outlive
            # the entry before them). Its copies since those marks are this batch's own.
            resumed = ledger.Entry(batch_id, ledger.ROUTING, dict(taken), self._names())
            ledger.append(self._producer(), self.ledger_topic, resumed)
        report = BatchReport(batch_id)
        if self.backend is not None:
            try:
                report = self._decided_on_driver(frame, batch_id, resumed, clock, as_rows,
                                                 taken)
                self.backend.flush()  # outcomes stored before Spark commits the batch
                clock.done("store")
            except BaseException:
                self.backend.discard()
                raise
        elif self.transform is not None:
            report = self._transformed(frame, batch_id, resumed, clock, as_rows, taken)
        else:
            report = self._functions(frame, batch_id, {}, resumed, clock, taken)
        report = replace(report, steps=tuple(clock.steps))
        data = {**report.to_dict(), **self._names()}
        ledger.append(self._producer(), self.ledger_topic, ledger.Entry(batch_id, ledger.DONE,
                                                                         report=data))
        if self.brake is not None:
            self.brake.done(batch_id)

    def _producer(self) -> Any:
        return cached_producer(self.connection)

    def _decided_on_driver(self, frame: Any, batch_id: int, resumed: ledger.Entry | None,
                           clock: StepClock, as_rows: bool,
                           taken: dict[str, int]) -> BatchReport:
        if self.transform is not None:
            return self._transformed(frame, batch_id, resumed, clock, as_rows, taken)
        frame = frame.persist()
        try:
            skip = {place: reason for place, (reason, _) in self._admit(frame).items()}
            clock.done("admit")
            return self._functions(frame, batch_id, skip, resumed, clock, taken)
        finally:
            frame.unpersist()

    # --- the per-record and pandas forms -------------------------------------------------------

    def _functions(self, frame: Any, batch_id: int, skip: dict[tasks.Coordinates, str],
                   resumed: ledger.Entry | None, clock: StepClock,
                   taken: dict[str, int]) -> BatchReport:
        processed = self._processed(frame, skip).persist()
        F = functions(processed)
        try:
            self._write_sink(processed.where(F.col("status") == OK).select("output.*"), batch_id)
            clock.done("write")
            outcomes, per_partition = _count_processed(processed, self.brake is not None)
            clock.done("count")
            routes: tuple[Routed, ...] = ()
            failed = (processed.where(F.col("status") == FAILED).select(*tasks.ROUTING_COLUMNS)
                      if any(o.status == FAILED for o in outcomes) else None)
            at_ms = self._judge(processed.where(F.col("status") != SKIPPED), failed, batch_id,
                                clock, per_partition)
            if failed is not None:
                routes = (self._route_to_backend(failed, batch_id, resumed, clock, taken)
                          if self.backend is not None
                          else self._route(failed, batch_id, resumed, clock, taken,
                                           at_ms=at_ms))
                clock.done("route")
            if self.backend is not None:
                for record in _records(processed.where((F.col("status") == OK)
                                                       & _has_redrive(F))):
                    self.backend.succeeded(record)
                clock.done("store")
            handler_us, late_s = _samples(processed)
            clock.done("count")
        finally:
            processed.unpersist()
        return BatchReport(batch_id, outcomes, routes, handler_us, late_s)

    def _processed(self, frame: Any, skip: dict[tasks.Coordinates, str]) -> Any:
        """The batch with each record's outcome: status, error columns and the user's output."""
        from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
        from pyspark.sql.types import StructField, StructType

        extra = [StructField(name, from_arrow_type(kind)) for name, kind in tasks.STATUS_COLUMNS]
        schema = StructType([*frame.schema.fields, *extra,
                             StructField("output", self.output_schema)])
        body = partial(tasks.process_batches, record_function=self.function,
                       batch_function=self.batch_function, error_column=self.error_column,
                       policy=self.policy, group=self.group,
                       output_type=to_arrow_type(self.output_schema), skip=skip)
        return frame.mapInArrow(body, schema)

    # --- the DataFrame form --------------------------------------------------------------------

    def _transformed(self, frame: Any, batch_id: int, resumed: ledger.Entry | None,
                     clock: StepClock, as_rows: bool, taken: dict[str, int]) -> BatchReport:
        """The DataFrame form's batch. Records on which the transform fails by itself (see
        poison) are found when the write fails; the batch then runs again without them, and
        they are routed with the rest of its failures."""
        unfit: dict[tasks.Coordinates, ErrorInfo] = {}
        while True:
            try:
                return self._transformed_once(frame, batch_id, resumed, clock, as_rows, taken,
                                              unfit)
            except poison.PoisonFound as found:
                unfit.update(found.records)

    def _transformed_once(self, frame: Any, batch_id: int, resumed: ledger.Entry | None,
                          clock: StepClock, as_rows: bool, taken: dict[str, int],
                          unfit: Mapping[tasks.Coordinates, ErrorInfo]) -> BatchReport:
        F = functions(frame)
        assert self.transform is not None
        tally = BatchTally(frame, self.group, self.topics, now_ms(),
                           self.partitions if self.brake is not None else None)
        mine, malformed = tally.mine, tally.malformed
        # Read by the sink's write and again by routing (and the tally, should it be counted
        # apart): held as rows, not cached as columns, unless lost once (see sql.hold).
        held = hold(frame, as_rows=as_rows)
        output = None
        try:
            refused: dict[tasks.Coordinates, tuple[str, int]] = {}
            admitted = tally.observe_batch(held).where(mine & ~malformed)
            if self.backend is not None:
                refused = self._admit(held)
                clock.done("admit")
            left_out = {**refused, **unfit}
            admitted = _without(admitted, left_out)
            # Kept, so that routing copies exactly the rows the write left out: a transform
            # need not give the same errors twice (a call to a service, a random sample).
            output = tally.observe_output(self.transform(admitted), self.error_column).persist()
            try:
                self._write_sink(output.where(~error_set(output, self.error_column))
                                 .drop(self.error_column), batch_id)
            except Exception as exc:
                if lost_held_rows(exc):
                    raise  # not the records' doing: the batch runs again persisted
                found = self._unfit(_without(held.where(mine & ~malformed), left_out), unfit)
                clock.done("isolate")
                if not found:
                    raise
                raise poison.PoisonFound(found) from exc
            clock.done("write")
            tallied = tally.result(held, output, self.error_column)
            clock.done("count")
            routes: tuple[Routed, ...] = ()
            bad = sum(row["n"] for row in tallied.counted if row["status"] == FAILED)
            rows = None
            if tallied.failed + bad + len(unfit):
                rows = routing_rows(output, self.error_column, source=held)
                if bad:
                    rows = rows.unionByName(routing_rows(held.where(malformed), None))
                if unfit:
                    rows = rows.unionByName(poison.routing_rows(held, unfit))
            if rows is not None and self.backend is None:
                rows = fetch_rows(rows, tallied.failed + bad + len(unfit))
                if isinstance(rows, pa.Table):
                    clock.done("fetch")
            at_ms = self._judge(held.where(mine), rows, batch_id, clock, tallied.per_partition)
            if rows is not None:
                routes = (self._route_to_backend(rows, batch_id, resumed, clock, taken)
                          if self.backend is not None
                          else self._route(rows, batch_id, resumed, clock, taken, at_ms=at_ms))
                clock.done("route")
            if self.backend is not None:
                failed = output.where(error_set(output, self.error_column)).select(*IDENTITY)
                # From the held rows, not the observed ones: the tally counts the write alone.
                copies = _without(held.where(mine & ~malformed & _has_redrive(F)), left_out)
                for record in _records(copies.join(failed, list(IDENTITY), "left_anti")):
                    self.backend.succeeded(record)
                clock.done("store")
        finally:
            if output is not None:
                output.unpersist()
            release(held)
        outcomes = _refused_out(_outcomes_of(tallied.counted, routes), refused)
        return BatchReport(batch_id, outcomes, routes, (), tallied.late_s)

    def _unfit(self, candidates: Any, unfit: Mapping[tasks.Coordinates, ErrorInfo]
               ) -> dict[tasks.Coordinates, ErrorInfo]:
        """The batch's records on which the transform fails by itself, besides `unfit`."""
        assert self.transform is not None
        candidates = candidates.persist()  # read by every step of the search
        try:
            return poison.find(self.transform, candidates, already=len(unfit))
        finally:
            candidates.unpersist()

    # --- routing and the sink ------------------------------------------------------------------

    def _judge(self, counted: Any, failed: Any, batch_id: int, clock: StepClock,
               counts: Mapping[tuple[str, int], int] | None = None) -> int | None:
        """With a dead-letter limit, judge the batch before anything of it is copied (see
        spark.brake); the time routing decides at."""
        if self.brake is None:
            return None
        at_ms = self.brake.judge(counted, None if failed is None else partial(
            decide, failed, self.route_policy, self.group, self.partitions), batch_id, counts)
        clock.done("brake")
        return at_ms

    def _route(self, rows: Any, batch_id: int, resumed: ledger.Entry | None, clock: StepClock,
               taken: dict[str, int], *, at_ms: int | None = None) -> tuple[Routed, ...]:
        """Copy failed rows (fetched already, or a DataFrame) with confirmation; a resumed batch
        skips copies already written. The marks taken before copying are kept in `taken` too,
        for a run again in this process."""
        already, marks = self._begin_routing(batch_id, resumed, clock, taken)
        return tuple(route_rows(rows, self.connection, self.group, self.route_policy,
                                self.partitions, already, marks, at_ms=at_ms))

    def _begin_routing(self, batch_id: int, resumed: ledger.Entry | None, clock: StepClock,
                       taken: dict[str, int]
                       ) -> tuple[frozenset[ledger.CopyKey], dict[str, int]]:
        """Mark the routing in the ledger, or find what a run before this one copied; the
        marks the batch's copies go after."""
        already, marks = ledger.begin_routing(
            self.connection, self._producer(), self.ledger_topic, batch_id,
            {t: self.partitions.get(t, 0) for t in self.destinations}, resumed, self._names(),
            self.group)
        taken.update(marks)
        if resumed is not None and resumed.state == ledger.ROUTING:
            log.info("pipeline %s: batch %d resumes routing; %d copies already written",
                     self.group, batch_id, len(already))
        clock.done("ledger")
        return already, marks

    def _write_sink(self, successes: Any, batch_id: int) -> None:
        F = functions(successes)
        if callable(self.sink):
            self.sink(successes, batch_id)
            return
        rows = (successes.withColumn(QUERY_COLUMN, F.lit(self.query["id"]))
                .withColumn(BATCH_COLUMN, F.lit(batch_id)))
        writer = (rows.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
                  .format(self.sink_format))
        if "/" in self.sink or ":" in self.sink:
            writer.partitionBy(QUERY_COLUMN, BATCH_COLUMN).save(self.sink)
        elif rows.sparkSession.catalog.tableExists(self.sink):
            self._overwrite_partition(self.sink, successes, batch_id)
        else:
            writer.partitionBy(QUERY_COLUMN, BATCH_COLUMN).saveAsTable(self.sink)

    def _overwrite_partition(self, table: str, successes: Any, batch_id: int) -> None:
        """Put the batch in an existing table (made by the first batch, or by the user) in place
        of its own partition, named in full. An overwrite through DataFrameWriter.insertInto
        follows spark.sql.sources.partitionOverwriteMode, static by default, where it empties
        the whole table: a table the user made kept only the last batch (the writer's own
        partitionOverwriteMode option is not read there). Columns go by name: an INSERT puts
        them by position, and a table made with its columns in another order would take each
        value into the wrong one, or fail casting it."""
        spark = successes.sparkSession
        columns = _sink_columns(table, [f.name for f in spark.table(table).schema.fields],
                                successes.columns)
        view = f"redrive_batch_{uuid.uuid4().hex}"
        successes.createOrReplaceTempView(view)
        try:
            spark.sql(f"INSERT OVERWRITE TABLE {table} PARTITION ({QUERY_COLUMN} = "
                      f"'{self.query['id']}', {BATCH_COLUMN} = {int(batch_id)}) "
                      f"SELECT {', '.join(map(quoted, columns))} FROM {view}")
        finally:
            spark.catalog.dropTempView(view)

    # --- a backend deciding on the driver ------------------------------------------------------

    def _admit(self, frame: Any) -> dict[tasks.Coordinates, tuple[str, int]]:
        """Ask the backend, in offset order, which copies it has already seen an outcome for:
        the records it refused, with why and the attempt they were on."""
        assert self.backend is not None
        refused: dict[tasks.Coordinates, tuple[str, int]] = {}
        records = sorted(_records(frame.where(_has_redrive(functions(frame)))),
                         key=lambda r: (r.topic, r.partition, r.offset))
        self.backend.prefetch(records)
        for record in records:
            verdict = self.backend.admit(record)
            if verdict is not Verdict.PROCESS:
                refused[(record.topic, record.partition, record.offset)] = (
                    verdict.value, record.delivery.attempt)
        return refused

    def _route_to_backend(self, failed: Any, batch_id: int, resumed: ledger.Entry | None,
                          clock: StepClock, taken: dict[str, int]) -> tuple[Routed, ...]:
        """Route on executors, then hand each decision to the backend on the driver; copies
        (the delay queue's) go through the ledger as the retry topics' do."""
        from pyspark.sql.pandas.types import from_arrow_schema

        assert self.backend is not None
        already = (self._begin_routing(batch_id, resumed, clock, taken)[0]
                   if self.destinations else frozenset())
        routed = failed.mapInArrow(
            partial(tasks.route_batches, policy=self.route_policy, group=self.group,
                    partitions=dict(self.partitions)),
            from_arrow_schema(tasks.ROUTED_SCHEMA)).collect()
        copies: list[kafka.OutRecord] = []
        counts: Counter[tuple[str, str | None, int, str | None, str, int]] = Counter()
        for row in routed:
            pairs: h.Headers = [(pair["key"], tasks.optional_bytes(pair["value"]))
                              for pair in row["headers"]]
            decision = _decision(row, pairs)
            record = Record(row["source_topic"], -1, -1, -1, tasks.optional_bytes(row["key"]),
                            tasks.optional_bytes(row["value"]), pairs, h.read_delivery(pairs))
            copy = self.backend.failed(record, decision, self.partitions)
            if copy is not None and not (already and ledger.copy_key(copy.headers) in already):
                copies.append(copy)
            counts[(row["kind"], row["reason"], row["attempt"], row["topic"],
                    row["source_topic"], row["source_attempt"])] += 1
        if copies:
            kafka.produce_acked(self._producer(), copies, shrink=slimmed)
        return tuple(Routed(kind, reason, attempt, topic, n, source, source_attempt)
                     for (kind, reason, attempt, topic, source, source_attempt), n
                     in counts.items())


def _without(frame: Any, records: Mapping[tasks.Coordinates, Any]) -> Any:
    """`frame` without these records: few, copies the backend refused and records the
    transform cannot compute."""
    if not records:
        return frame
    F = functions(frame)
    places = frame.sparkSession.createDataFrame(
        list(records), "topic string, partition int, offset long")
    return frame.join(F.broadcast(places), list(IDENTITY), "left_anti")


def _refused_out(outcomes: tuple[Outcomes, ...],
                 refused: Mapping[tasks.Coordinates, tuple[str, int]]) -> tuple[Outcomes, ...]:
    """A transformed batch's outcomes with the records the backend refused moved from OK to
    SKIPPED, with the backend's reason: the tally counted them with the rest of the batch."""
    if not refused:
        return outcomes
    skipped: Counter[tuple[int, str, str]] = Counter(
        (attempt, topic, reason) for (topic, _, _), (reason, attempt) in refused.items())
    moved = Counter((attempt, topic) for (topic, _, _), (_, attempt) in refused.items())
    kept = []
    for row in outcomes:
        out = min(row.n, moved[(row.attempt, row.topic)]) if row.status == OK else 0
        moved[(row.attempt, row.topic)] -= out
        if row.n > out:
            kept.append(row._replace(n=row.n - out, early=min(row.early, row.n - out)))
    kept.extend(Outcomes(SKIPPED, attempt, topic, reason, n)
                for (attempt, topic, reason), n in skipped.items())
    return tuple(kept)


def _outcomes_of(counted: Sequence[Mapping[str, Any]], routes: tuple[Routed, ...]
                 ) -> tuple[Outcomes, ...]:
    """A transformed batch's outcomes: its rows by class, those the transform failed moved from
    OK to FAILED by what routing found of them."""
    failed_from: Counter[tuple[int, str]] = Counter()
    for route in routes:
        if route.source_attempt >= 0:
            failed_from[(route.source_attempt, route.source_topic)] += route.n
    outcomes = []
    for row in counted:
        status, attempt, topic, n = row["status"], row["attempt"], row["topic"], row["n"]
        if status == OK:
            failed = min(n, failed_from.pop((attempt, topic), 0))
            if failed:
                outcomes.append(Outcomes(FAILED, attempt, topic, None, failed))
            n -= failed
        skip = SKIPPED_OTHER_GROUP if status == SKIPPED else None
        if n:
            outcomes.append(Outcomes(status, attempt, topic, skip, n, row["early"]))
    return tuple(outcomes)


def _count_processed(processed: Any, per_partition: bool = False
                     ) -> tuple[tuple[Outcomes, ...], dict[tuple[str, int], int] | None]:
    """The batch's outcomes by class; with `per_partition`, also its records that were not
    skipped per partition (for the brake), counted by the same job."""
    F = functions(processed)
    early = F.when(F.col("due_ms").isNotNull() & (F.col("handled_ms") < F.col("due_ms")), 1)
    keys = ["status", "attempt", "topic", "skip_reason", *(["partition"] * per_partition)]
    rows = (processed.groupBy(*keys)
            .agg(F.count(F.lit(1)).alias("n"), F.count(early).alias("early"),
                 F.sum("in_place").alias("in_place"))
            .collect())
    classes: Counter[tuple[str, int, str, str | None]] = Counter()
    early_n: Counter[tuple[str, int, str, str | None]] = Counter()
    in_place: Counter[tuple[str, int, str, str | None]] = Counter()
    partitions: Counter[tuple[str, int]] = Counter()
    for row in rows:
        key = (row["status"], row["attempt"], row["topic"], row["skip_reason"])
        classes[key] += row["n"]
        early_n[key] += row["early"]
        in_place[key] += row["in_place"] or 0
        if per_partition and row["status"] != SKIPPED:
            partitions[(row["topic"], row["partition"])] += row["n"]
    return (tuple(Outcomes(*key, n, early_n[key], in_place[key]) for key, n in classes.items()),
            dict(partitions) if per_partition else None)


def _samples(processed: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Handler times and lateness past due, from one sample of the batch (one Spark job)."""
    F = functions(processed)
    late = ((F.col("handled_ms") - F.col("due_ms")) / 1000).alias("late")
    handler_us: list[int] = []
    late_s: list[float] = []
    for row in (processed.where(F.col("handler_us").isNotNull() | F.col("due_ms").isNotNull())
                .select("handler_us", late).limit(SAMPLE).collect()):
        if row["handler_us"] is not None:
            handler_us.append(row["handler_us"])
        if row["late"] is not None:
            late_s.append(row["late"])
    return tuple(handler_us), tuple(late_s)


def _has_redrive(F: ModuleType) -> Any:
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


def _decision(row: Any, pairs: list[tuple[str, bytes | None]]) -> Route:
    if row["kind"] == RETRY:
        return Retry(row["topic"], h.read_due(pairs) or 0, pairs, row["attempt"],
                     row["partition"])
    assert row["kind"] == DEAD_LETTER
    return DeadLetter(row["topic"], pairs, row["reason"], row["attempt"], row["partition"])


def _sink_columns(sink: str, table: Sequence[str], output: Sequence[str]) -> list[str]:
    """The output's columns in the order of the sink table's own (but its partition columns);
    names match as Spark's do, whatever their case."""
    by_name = {name.lower(): name for name in output}
    wanted = [name for name in table if name not in (QUERY_COLUMN, BATCH_COLUMN)]
    missing = [name for name in wanted if name.lower() not in by_name]
    extra = sorted(set(by_name) - {name.lower() for name in wanted})
    if missing or extra:
        raise InvalidArgument("sink", sink, f"the table's columns {wanted} are not the "
                              f"output's {list(output)}: missing from the output {missing}, "
                              f"not in the table {[by_name[name] for name in extra]}")
    return [by_name[name.lower()] for name in wanted]

