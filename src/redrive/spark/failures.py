"""route_failures: copy a batch's failed rows to their retry or dead-letter topics, from inside a
user's own foreachBatch, and say how many went where.

Errors are data here: a struct column `error` (`type`, `message`; null on success), as a
DataFrame transform computes them in the JVM. Classification goes by the type's name
(`error_type("ParseError")`) and the message; a row whose error has no type cannot be classified
and goes to the dead-letter topic as `malformed`, as does a row whose redrive headers are
unreadable (`redrive.malformed`, from `retry_stream`). Routing and producing run on the
executors in one job, and the call returns only once the broker acknowledged every copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import pyarrow as pa

from redrive import kafka, topics
from redrive.arguments import check_instance
from redrive.errors import InvalidArgument
from redrive.policy import DeadLetterLimit, RetryPolicy
from redrive.spark import ledger, tasks
from redrive.spark.brake import QueryBrake
from redrive.spark.checkpoint import query_id
from redrive.spark.columns import REDRIVE_COLUMN
from redrive.spark.ledger import CopyKey
from redrive.spark.outcomes import DEAD_LETTER, RETRY, Routed
from redrive.spark.producers import cached_producer
from redrive.spark.sql import error_set, functions, quoted

IDENTITY = ("topic", "partition", "offset")
# A DataFrame-form batch with at most this many failed rows has them routed in the foreachBatch
# process itself, fetched as Arrow, rather than by a Spark job: on Spark Connect that job starts
# new Python workers for every batch, each making its idempotent producer anew (0.5-1 s before its
# first copy on noida-db); 50,000 failed rows took 4.5 s that way against 5.5-5.8 s as a job, and
# 2.5 s against 2.8-3.0 s on a classic session (bench/spark.py's P8 batch). More than this are
# routed on the executors, so that no one process holds them all.
ROUTE_HERE_MAX = 100_000
_KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


class RouteCounts(tuple[Routed, ...]):
    """What route_failures did: one Routed per (kind, reason, attempt, topic)."""

    @property
    def retried(self) -> int:
        return sum(r.n for r in self if r.kind == RETRY)

    @property
    def dead_lettered(self) -> int:
        return sum(r.n for r in self if r.kind == DEAD_LETTER and r.topic is not None)

    @property
    def total(self) -> int:
        return sum(r.n for r in self)


def check_error_column(schema: Any, name: str) -> None:
    """The error column must be struct<type: string, message: string>; fail naming what is."""
    from pyspark.sql.types import StringType, StructType

    if name not in schema.names:
        raise InvalidArgument("error_column", name,
                              f"the DataFrame has no such column (it has {schema.names})")
    found = schema[name].dataType
    fields = {f.name: f.dataType for f in found.fields} if isinstance(found, StructType) else {}
    if not (isinstance(fields.get("type"), StringType)
            and isinstance(fields.get("message"), StringType)):
        raise InvalidArgument("error_column", f"{name} {found.simpleString()}",
                              "expected struct<type: string, message: string>")


def check_transform_output(frame: Any, error_column: str) -> None:
    """What RetryPipeline needs of a transform's output, checked on its schema: the error
    column, and the record's identity, by which a failed row's record is found in the batch."""
    check_error_column(frame.schema, error_column)
    _require(frame, IDENTITY, "the failed rows are found in the batch by these columns; "
             "keep them in the transform's output")


def routing_rows(frame: Any, error_column: str | None, source: Any = None) -> Any:
    """The failed rows of `frame` in the routing job's columns (tasks.ROUTING_COLUMNS).

    Without `source`, `frame` must keep the Kafka columns; with it, `frame` needs only the
    record's identity (topic, partition, offset) and the rest is joined from `source`. With no
    error column, only rows with unreadable redrive headers have failed.
    """
    F = functions(frame)

    if error_column is None:
        failed, error_type, error_message = F.lit(False), F.lit(""), F.lit("")
    else:
        error = F.col(quoted(error_column))
        failed = error_set(frame, error_column)
        error_type = F.coalesce(error.getField("type"), F.lit(""))
        error_message = F.coalesce(error.getField("message"), F.lit(""))
    if REDRIVE_COLUMN in frame.columns:
        malformed = F.col(REDRIVE_COLUMN).getField("malformed")
        failed = failed | malformed.isNotNull()
        error_type = F.when(malformed.isNotNull(), F.lit("MalformedHeader")).otherwise(error_type)
        error_message = F.coalesce(malformed, error_message)
    errors = [error_type.alias("error_type"), error_message.alias("error_message"),
              F.lit(None).cast("string").alias("error_trace"),
              F.lit(None).cast("string").alias("error_chain")]
    if source is None:
        _require(frame, _KAFKA_COLUMNS, "route_failures needs the record's Kafka columns "
                 "(or pass source= the batch they came from)")
        return frame.where(failed).select(*_KAFKA_COLUMNS, *errors)
    _require(frame, IDENTITY, "the failed rows are found in the batch by these columns; "
             "keep them in the transform's output")
    keys = frame.where(failed).select(*IDENTITY, *errors)
    joined = source.select(*_KAFKA_COLUMNS).join(F.broadcast(keys), list(IDENTITY))
    return joined.select(*tasks.ROUTING_COLUMNS)


def succeeded(batch: Any, error_column: str = "error") -> Any:
    """The rows of `batch` that route_failures copies nowhere, to write to your sink: its error
    column says no failure (null, or a struct whose type and message are both null), and, where
    the batch has the `redrive` column, its redrive headers were readable."""
    ok = ~error_set(batch, error_column)
    if REDRIVE_COLUMN in batch.columns:
        ok = ok & functions(batch).col(REDRIVE_COLUMN).getField("malformed").isNull()
    return ok


def _require(frame: Any, columns: Iterable[str], why: str) -> None:
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise InvalidArgument("columns", missing[0], f"missing from the DataFrame: {why}")


def route_rows(rows: Any, connection: kafka.Connection, group: str, policy: RetryPolicy,
               partitions: Mapping[str, int], already: frozenset[CopyKey] = frozenset(),
               marks: Mapping[str, int] | None = None, *, at_ms: int | None = None
               ) -> RouteCounts:
    """Route and produce rows in tasks.ROUTING_COLUMNS and count the routes: on the executors,
    or in this process where `rows` were fetched already (an Arrow table, see fetch_rows).
    `marks`, the ledger's routing marks, let a task Spark runs again skip the copies its earlier
    attempt wrote; `at_ms`, the time the brake decided the same rows at, makes routing decide
    at it too."""
    from pyspark.sql.pandas.types import from_arrow_schema

    body = tasks.RouteAndProduce(policy, group, dict(partitions),
                                 connection if isinstance(connection, str) else dict(connection),
                                 already=already, marks=dict(marks or {}), now_ms=at_ms)
    if isinstance(rows, pa.Table):
        found = pa.Table.from_batches(list(body(iter(rows.to_batches()))),
                                      schema=tasks.ROUTE_COUNTS_SCHEMA).to_pylist()
    else:
        found = rows.mapInArrow(body, from_arrow_schema(tasks.ROUTE_COUNTS_SCHEMA)).collect()
    return RouteCounts(Routed(row["kind"], row["reason"], row["attempt"], row["topic"],
                              row["count"], row["source_topic"], row["source_attempt"])
                       for row in found)


def fetch_rows(rows: Any, failed: int | None) -> Any:
    """The failed rows to route: fetched as Arrow into this process where the batch counted
    few enough (see ROUTE_HERE_MAX), else the DataFrame, routed on the executors."""
    return rows.toArrow() if failed is not None and failed <= ROUTE_HERE_MAX else rows


def decide(rows: Any, policy: RetryPolicy, group: str, partitions: Mapping[str, int],
           at_ms: int) -> pa.Table:
    """Which of the failed rows (fetched, or a DataFrame) go to the dead-letter topic, decided
    as route_rows decides at `at_ms` (tasks.DECIDED_SCHEMA)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    body = tasks.Decide(policy, group, dict(partitions), at_ms)
    if isinstance(rows, pa.Table):
        return pa.Table.from_batches(list(body(iter(rows.to_batches()))),
                                     schema=tasks.DECIDED_SCHEMA)
    return rows.mapInArrow(body, from_arrow_schema(tasks.DECIDED_SCHEMA)).toArrow()


def route_failures(batch: Any, connection: kafka.Connection, group: str, policy: RetryPolicy,
                   error_column: str = "error", *, source: Any = None,
                   batch_id: int | None = None, checkpoint: str | None = None) -> RouteCounts:
    """Copy the failed rows of a micro-batch to their retry or dead-letter topic.

    Call it inside your own foreachBatch, on the DataFrame your transform made of the batch
    `retry_stream` gave you; write `batch.where(succeeded(batch))` to your sink (a row whose
    error struct has a null type and a null message counts as a success). Returns once every
    copy is acknowledged (raises otherwise, so Spark does not commit the batch), with the
    number of records per route. A record with several failed rows is copied once where its
    rows share a partition of `batch`; after a shuffle (a join, a repartition), pass `source=`
    the batch `retry_stream` gave you, from which the failed records are then joined.

    Pass `batch_id=` foreachBatch's batch id, and `checkpoint=` the query's checkpointLocation,
    so that a batch Spark runs again (after a crash, or a write of yours that failed after this
    call) copies only what its first run did not: the group's ledger topic keeps where the
    group's retry and dead-letter partitions ended before the batch copied. The checkpoint tells
    the query's batches from another query's (a new checkpoint numbers its batches from 0
    again, even at a path where an earlier one was deleted: the query's id in it tells them
    apart; reading it is one small Spark read, about 80 ms here, which a classic session does
    once a query and Spark Connect once a call). Without them a batch run again, or a task
    Spark runs again after a failure, copies its failures again, and each is then handled
    twice.
    """
    topics.check_name("group", group)
    check_instance("policy", policy, RetryPolicy, "a RetryPolicy")
    check_error_column(batch.schema, error_column)
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int)
                                 or batch_id < 0):
        raise InvalidArgument("batch_id", batch_id, "must be foreachBatch's batch id, an int >= 0")
    if (batch_id is None) != (checkpoint is None) or checkpoint == "":
        raise InvalidArgument("checkpoint", checkpoint, "give batch_id and checkpoint (the "
                              "query's checkpointLocation) together: batch ids start again at 0 "
                              "with a new checkpoint")
    query = (None if checkpoint is None else
             {"by": _BY, "checkpoint": checkpoint,
              "query": query_id(batch.sparkSession, checkpoint)})
    rows = routing_rows(batch, error_column, source)
    if source is not None and REDRIVE_COLUMN not in batch.columns \
            and REDRIVE_COLUMN in source.columns:
        # The output dropped the batch's `redrive` column: a record with unreadable redrive
        # headers is still dead-lettered as malformed, once, whatever its output rows say.
        F = functions(source)
        unreadable = source.where(F.col(REDRIVE_COLUMN).getField("malformed").isNotNull())
        rows = (rows.join(unreadable.select(*IDENTITY), list(IDENTITY), "left_anti")
                .unionByName(routing_rows(unreadable, None)))
    admin = kafka.admin(connection)
    partitions = kafka.topic_partitions(admin)
    brake = None
    at_ms = None
    if policy.dead_letter_limit is not None:
        brake = _BRAKES.setdefault(
            (group, None if query is None else query["query"], policy.dead_letter_limit),
            QueryBrake(policy.dead_letter_limit, group, connection))
        # A record's rows: one in the source, maybe several in a transform's output.
        counted = source if source is not None else batch.dropDuplicates(list(IDENTITY))
        if REDRIVE_COLUMN in counted.columns:  # another group's copies are not its records
            owner = functions(counted).col(REDRIVE_COLUMN).getField("group")
            counted = counted.where(owner.isNull() | (owner == group))
        at_ms = brake.judge(counted, partial(decide, rows, policy, group, partitions),
                            batch_id)
    already: frozenset[CopyKey] = frozenset()
    marks: dict[str, int] = {}
    if batch_id is not None and query is not None:
        already, marks = _copied_before(connection, admin, group, policy, partitions, batch_id,
                                        query)
    counts = route_rows(rows, connection, group, policy, partitions, already, marks,
                        at_ms=at_ms)
    if brake is not None:
        brake.done(batch_id)
    return counts


# Each query's brake, in the process that runs its foreachBatch (on Spark Connect, the server's
# worker for the query): its counts carry on from batch to batch.
_BRAKES: dict[tuple[str, str | None, DeadLetterLimit], QueryBrake] = {}


_BY = "route_failures"  # marks this function's ledger entries apart from RetryPipeline's


def _copied_before(connection: kafka.Connection, admin: Any, group: str, policy: RetryPolicy,
                   partitions: dict[str, int], batch_id: int,
                   report: dict[str, str]) -> tuple[frozenset[CopyKey], dict[str, int]]:
    """The copies an earlier run of this batch of this query (named by `report`) wrote, found
    through the group's ledger (on a first run, none, once the routing marks are in it), and
    the marks the batch's copies go after."""
    name = ledger.ledger_topic(group)
    if name not in partitions:
        kafka.create_topics(admin, {name: 1})
    previous = ledger.last(connection, name)
    resumed = previous if (previous is not None and previous.batch == batch_id
                           and dict(previous.report) == report) else None
    return ledger.begin_routing(connection, cached_producer(connection), name, batch_id,
                                _destinations(policy, group, partitions), resumed, report, group)


def _destinations(policy: RetryPolicy, group: str, partitions: Mapping[str, int]
                  ) -> dict[str, int]:
    """The group's retry and dead-letter topics on the cluster, with their partition counts:
    those `policy` plans for any of the cluster's topics, for this group only (a copy in
    another group's topic is not this group's)."""
    found: dict[str, int] = {}
    for topic in partitions:
        try:
            planned = topics.plan(policy, topic, group).created_topics
        except InvalidArgument:
            continue  # a name the group's topics would outgrow: none of them can exist
        found.update((name, partitions[name]) for name in planned if name in partitions)
    return found
