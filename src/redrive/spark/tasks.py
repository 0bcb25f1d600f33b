"""What RetryPipeline runs on executors: the user's function over Arrow batches, and routing.

Everything here must be importable on a Spark worker and is pickled by reference; the user's
function and the policy travel with the task (cloudpickle).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import pyarrow as pa

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.errors import MalformedHeader, OutputMismatch
from redrive.first_failures import FirstFailures
from redrive.gc_pause import gc_paused
from redrive.metrics import SKIPPED_OTHER_GROUP
from redrive.oversize import slimmed
from redrive.policy import Disposition, RetryPolicy
from redrive.record import ErrorInfo, Record
from redrive.routing import DeadLetter, Route, route
from redrive.spark.columns import unreadable_name
from redrive.spark.ledger import CopyKey, copies_since, copy_key
from redrive.spark.outcomes import DEAD_LETTER, FAILED, OK, RETRY, SKIPPED
from redrive.spark.producers import produce_cached
from redrive.topics import partition_for

RecordFunction = Callable[[dict[str, Any]], Mapping[str, Any]]
BatchFunction = Callable[[Any], Any]  # pandas.DataFrame -> pandas.DataFrame with an error column

# Columns the process step adds to the source's; `output` holds the user's result struct.
STATUS_COLUMNS = [
    ("status", pa.string()),
    ("attempt", pa.int32()),
    ("due_ms", pa.int64()),
    ("handled_ms", pa.int64()),
    ("in_place", pa.int32()),
    ("skip_reason", pa.string()),
    ("handler_us", pa.int64()),
    ("error_type", pa.string()),
    ("error_message", pa.string()),
    ("error_trace", pa.string()),
    ("error_chain", pa.string()),
]
ROUTED_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("source_topic", pa.string()),  # the topic the failed record was read from
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("partition", pa.int32()),
    ("kind", pa.string()),
    ("reason", pa.string()),
    ("attempt", pa.int32()),
    ("source_attempt", pa.int32()),  # the attempt the failed record was on (see _source_attempt)
])
# A failed record's route decided without copying it, for the dead-letter brake (spark.brake).
DECIDED_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("dead", pa.bool_()),
])
ROUTE_COUNTS_SCHEMA = pa.schema([
    ("kind", pa.string()),
    ("reason", pa.string()),
    ("attempt", pa.int32()),
    ("topic", pa.string()),
    ("count", pa.int64()),
    ("source_topic", pa.string()),
    ("source_attempt", pa.int32()),
])



# What routing reads of a failed row (see failures): the rest of a processed row (its status
# columns and the output struct) is left out of the routing job's input.
ROUTING_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers",
                   "error_type", "error_message", "error_trace", "error_chain")
_ERROR_COLUMNS = ROUTING_COLUMNS[-4:]


def record_of(row: Mapping[str, Any]) -> Record:
    headers: h.Headers = [(pair["key"], optional_bytes(pair["value"]))
                        for pair in (row.get("headers") or [])]
    timestamp = row.get("timestamp")
    timestamp_ms = int(timestamp.timestamp() * 1000) if timestamp is not None else 0
    return Record(row["topic"], int(row["partition"]), int(row["offset"]), timestamp_ms,
                  optional_bytes(row.get("key")), optional_bytes(row.get("value")), headers)


def optional_bytes(value: Any) -> bytes | None:
    """Spark hands binary columns over as bytearray; clients and headers want bytes."""
    return None if value is None else bytes(value)


def user_input(record: Record) -> dict[str, Any]:
    """The dict a user's function receives: the Kafka fields and the record's retry history."""
    return {
        "key": record.key, "value": record.value, "topic": record.topic,
        "partition": record.partition, "offset": record.offset,
        "timestamp_ms": record.timestamp_ms, "headers": record.headers,
        "attempt": record.delivery.attempt, "first_failure_ms": record.delivery.first_failure_ms,
        "original_topic": record.origin().topic,
    }


@dataclass(frozen=True)
class Outcome:
    status: str
    output: Mapping[str, Any] | None = None
    error: ErrorInfo | None = None
    in_place: int = 0
    skip_reason: str | None = None


Coordinates = tuple[str, int, int]


def error_columns(error: ErrorInfo | None) -> dict[str, Any]:
    if error is None:
        return {"error_type": None, "error_message": None, "error_trace": None,
                "error_chain": None}
    return {"error_type": error.type_name, "error_message": error.message,
            "error_trace": error.trace, "error_chain": json.dumps(error.chain)}


def _error_info(type_name: str | None, message: str | None, trace: str | None,
                chain: str | None) -> ErrorInfo:
    kinds = tuple(tuple(names) for names in json.loads(chain or "[]"))
    return ErrorInfo(type_name or "", message or "", trace or "", kinds)


def failures(batch: pa.RecordBatch, routed: set[Coordinates]
             ) -> Iterator[tuple[Record, ErrorInfo]]:
    """The failed rows of a routing batch (ROUTING_COLUMNS) as records and their errors, each
    record once: a transform may make several rows of one record (explode) and fail more than
    one. The record goes by the first of them; `routed` holds the records a task has had, whose
    rows all come to it (joined from the batch, to the task that reads the record).

    Read column by column, since a dict per row costs about as much as routing the row, and each
    distinct error decoded once per batch: a batch's failures mostly share one error (an outage,
    a bad deploy), and its trace is the longest field of the row."""
    columns = [batch.column(name).to_pylist()
               for name in ("topic", "partition", "offset", "key", "value", "headers")]
    columns.append(batch.column("timestamp").cast(pa.int64()).to_pylist())
    errors = zip(*(batch.column(name).to_pylist() for name in _ERROR_COLUMNS), strict=True)
    known: dict[tuple[str | None, ...], ErrorInfo] = {}
    for (topic, partition, offset, key, value, pairs, stamp_us), error in zip(
            zip(*columns, strict=True), errors, strict=True):
        if (topic, partition, offset) in routed:
            continue
        routed.add((topic, partition, offset))
        info = known.get(error)
        if info is None:
            info = known[error] = _error_info(*error)
        headers: h.Headers = [(pair["key"], pair["value"]) for pair in pairs or ()]
        yield Record(topic, partition, offset, 0 if stamp_us is None else stamp_us // 1000,
                     key, value, headers), info


def call_with_in_place(function: Callable[[], Mapping[str, Any]], policy: RetryPolicy,
                       sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Run the user's function; errors the policy marks in-place are retried here first."""
    in_place = 0
    while True:
        try:
            output = function()
            if type(output) is not dict and not isinstance(output, Mapping):
                raise OutputMismatch(f"the function returned {type(output).__name__}, not a "
                                     "mapping of output_schema's fields")
            return Outcome(OK, dict(output), in_place=in_place)
        except Exception as exc:
            live = ErrorInfo.from_exception(exc)
        error = live.detached()
        budget = policy.in_place
        retry = budget is not None and in_place < budget.retries \
            and policy.disposition(live) is Disposition.IN_PLACE
        del live  # it must not outlive this frame: see ErrorInfo.detached
        if budget is None or not retry:
            return Outcome(FAILED, error=error, in_place=in_place)
        in_place += 1
        sleep(budget.backoff.delay_ms(in_place) / 1000)


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    due_ms: int | None
    handled_ms: int
    attempt: int
    handler_us: int | None = None  # time in the user's function, in-place retries included


def admit(row: Mapping[str, Any], group: str,
          skip: Mapping[Coordinates, str]) -> tuple[Record, Outcome | None]:
    """The row as a Record with its history, and an outcome if it is not to be handled.

    Headers are decoded once here: most records carry no redrive header at all. `skip` holds the
    records the retry backend refused on the driver (duplicates, records parked behind a key).
    """
    record = record_of(row)
    refused = skip.get((record.topic, record.partition, record.offset)) if skip else None
    if refused is not None:
        return record, Outcome(SKIPPED, skip_reason=refused)
    unreadable = unreadable_name(record.headers)
    if unreadable is None and not h.has_redrive(record.headers):
        return record, None
    try:
        if unreadable is not None:
            raise unreadable
        delivery = h.read_delivery(record.headers)
    except MalformedHeader as exc:
        owner = h.readable_group(record.headers)
        if owner is not None and owner != group:
            return record, Outcome(SKIPPED, skip_reason=SKIPPED_OTHER_GROUP)
        return record, Outcome(FAILED, error=ErrorInfo.from_exception(exc))
    record = Record(record.topic, record.partition, record.offset, record.timestamp_ms,
                    record.key, record.value, record.headers, delivery)
    if delivery.group is not None and delivery.group != group:
        return record, Outcome(SKIPPED, skip_reason=SKIPPED_OTHER_GROUP)
    return record, None


def process_rows(rows: Sequence[Mapping[str, Any]], function: RecordFunction,
                 policy: RetryPolicy, group: str,
                 skip: Mapping[Coordinates, str] | None = None) -> list[Result]:
    results: list[Result] = []
    for row in rows:
        record, early = admit(row, group, skip or {})
        delivery = record.delivery
        handled = now_ms()
        took: int | None = None
        if early is None:
            started = time.perf_counter_ns()
            early = call_with_in_place(partial(_apply, function, record), policy)
            took = (time.perf_counter_ns() - started) // 1000
        results.append(Result(early, delivery.due_ms, handled, delivery.attempt, took))
    return results


def _apply(function: RecordFunction, record: Record) -> Mapping[str, Any]:
    return function(user_input(record))


def process_frame(rows: Sequence[Mapping[str, Any]], function: BatchFunction, error_column: str,
                  policy: RetryPolicy, group: str,
                  skip: Mapping[Coordinates, str] | None = None) -> list[Result]:
    """The vectorized form: one pandas call per Arrow batch, with an error column per row."""
    import pandas as pd

    admitted = [admit(row, group, skip or {}) for row in rows]
    outcomes: list[Outcome | None] = [early for _, early in admitted]
    handled_rows = [index for index, early in enumerate(outcomes) if early is None]
    handled = now_ms()
    took: int | None = None
    if handled_rows:
        inputs = [user_input(admitted[index][0]) for index in handled_rows]
        started = time.perf_counter_ns()
        try:
            frame = function(pd.DataFrame(inputs))
            if len(frame) != len(inputs):
                raise ValueError(f"batch function returned {len(frame)} rows for {len(inputs)}")
            # pandas' missing values (None, NaN in an object column, pd.NA, NaT) are nulls, in
            # the error column as in the outputs, as Spark's own conversion of a frame takes them
            if error_column in frame.columns:
                errors, failed = list(frame[error_column]), (~frame[error_column].isna()).tolist()
            else:
                errors, failed = [None] * len(frame), [False] * len(frame)
            data = frame.drop(columns=[error_column], errors="ignore")
            outputs = data.astype(object).where(data.notna(), None).to_dict("records")
            for index, output, error, fails in zip(handled_rows, outputs, errors, failed,
                                                   strict=True):
                if isinstance(error, BaseException):
                    outcomes[index] = Outcome(FAILED,
                                              error=ErrorInfo.from_exception(error).detached())
                elif fails:
                    outcomes[index] = Outcome(FAILED, error=ErrorInfo("Error", str(error)))
                else:
                    outcomes[index] = Outcome(OK, output)
        except Exception as exc:
            failure = Outcome(FAILED, error=ErrorInfo.from_exception(exc).detached())
            for index in handled_rows:
                outcomes[index] = failure
        # one call for the whole batch: each row is charged its share
        took = (time.perf_counter_ns() - started) // 1000 // len(handled_rows)
    results: list[Result] = []
    for (record, early), outcome in zip(admitted, outcomes, strict=True):
        assert outcome is not None
        results.append(Result(outcome, record.delivery.due_ms, handled,
                              record.delivery.attempt, took if early is None else None))
    return results


def process_batches(batches: Iterator[pa.RecordBatch], *, record_function: RecordFunction | None,
                    batch_function: BatchFunction | None, error_column: str,
                    policy: RetryPolicy, group: str, output_type: pa.StructType,
                    skip: Mapping[Coordinates, str] | None = None) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the source columns, then status, error and the user's output struct."""
    for batch in batches:
        rows = batch.to_pylist()
        if batch_function is not None:
            results = process_frame(rows, batch_function, error_column, policy, group, skip)
        else:
            assert record_function is not None
            results = process_rows(rows, record_function, policy, group, skip)
        results = list(results)
        names = output_type.names  # a new list at each access
        outcomes = [_named_fields(result.outcome, names) for result in results]
        outputs = [_conform(outcome.output, names) for outcome in outcomes]
        _fractions(outcomes, outputs, _integer_fields(output_type))
        try:
            output_array = pa.array(outputs, type=output_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            _unfit(outcomes, outputs, output_type)
            output_array = pa.array(outputs, type=output_type)
        columns: dict[str, list[Any]] = {name: [] for name, _ in STATUS_COLUMNS}
        for result, outcome in zip(results, outcomes, strict=True):
            columns["status"].append(outcome.status)
            columns["attempt"].append(result.attempt)
            columns["due_ms"].append(result.due_ms)
            columns["handled_ms"].append(result.handled_ms)
            columns["in_place"].append(outcome.in_place)
            columns["skip_reason"].append(outcome.skip_reason)
            columns["handler_us"].append(result.handler_us)
            for name, value in error_columns(outcome.error).items():
                columns[name].append(value)
        arrays = [batch.column(i) for i in range(batch.num_columns)]
        arrays += [pa.array(columns[name], type=kind) for name, kind in STATUS_COLUMNS]
        arrays.append(output_array)
        fields = [*batch.schema, *(pa.field(name, kind) for name, kind in STATUS_COLUMNS),
                  pa.field("output", output_type)]
        yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _conform(output: Mapping[str, Any] | None, names: Sequence[str]) -> dict[str, Any] | None:
    if output is None:
        return None
    return {name: output.get(name) for name in names}


def _mismatch(outcome: Outcome, why: str) -> Outcome:
    error = ErrorInfo.from_exception(OutputMismatch(why)).detached()
    return Outcome(FAILED, error=error, in_place=outcome.in_place)


def _named_fields(outcome: Outcome, names: Sequence[str]) -> Outcome:
    """A success whose output has keys but none of output_schema's fields (`ID` for `id`)
    would be written as a row of nulls: it fails instead. Other keys (the record's own, passed
    through) are left out, and a field left out (or an empty output) is null."""
    output = outcome.output
    if outcome.status != OK or not output:
        return outcome
    for name in names:
        if name in output:
            return outcome
    return _mismatch(outcome, f"the output holds none of output_schema's fields "
                              f"({', '.join(names)}): it has {sorted(map(str, output))}")


@lru_cache(maxsize=64)
def _integer_fields(output_type: pa.StructType) -> tuple[tuple[str, pa.DataType], ...]:
    return tuple((field.name, field.type) for field in output_type
                 if pa.types.is_integer(field.type))


def _fractions(outcomes: list[Outcome], outputs: list[dict[str, Any] | None],
               fields: tuple[tuple[str, pa.DataType], ...]) -> None:
    """Arrow writes a float into an integer field cut to its whole part (1.5 as 1): such a
    record fails as not fitting instead. A whole float (2.0) fits."""
    for name, kind in fields:
        for index, output in enumerate(outputs):
            if output is None:
                continue
            value = output[name]
            if type(value) is float and not value.is_integer():
                outcomes[index] = _mismatch(
                    outcomes[index], f"output field {name!r} = {value!r} does not fit "
                                     f"output_schema's {kind}: it has a fraction")
                outputs[index] = None


def _unfit(outcomes: list[Outcome], outputs: list[dict[str, Any] | None],
           output_type: pa.StructType) -> None:
    """The records whose output does not fit output_schema fail, naming the field and value,
    instead of failing the batch's task (and the query) with Arrow's conversion error."""
    for index, output in enumerate(outputs):
        if output is None:
            continue
        for field in output_type:
            try:
                pa.array([output[field.name]], type=field.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                outcomes[index] = _mismatch(
                    outcomes[index], f"output field {field.name!r} = {output[field.name]!r} "
                                     f"does not fit output_schema's {field.type}: {exc}")
                outputs[index] = None
                break


def _routed(record: Record, error: ErrorInfo, first: FirstFailures, partitions: Mapping[str, int]
            ) -> tuple[Route, str, str | None, int | None]:
    """A failed record's route, the route's kind and dead-letter reason (None for a retry), and
    the copy's partition."""
    # A header name shown with U+FFFD parses as no redrive header, so routing alone would take
    # the row's MalformedHeader for a user's error to retry: it is a malformed dead letter.
    unreadable = unreadable_name(record.headers)
    if unreadable is not None:
        decision: Route = route(record, unreadable, first.policy, first.now_ms,
                                group=first.group)
    else:
        decision = first.route(record.topic, record.partition, record.offset,
                               record.timestamp_ms, record.headers, error) \
            or route(record, error, first.policy, first.now_ms, group=first.group)
    kind, reason = ((DEAD_LETTER, decision.reason) if isinstance(decision, DeadLetter)
                    else (RETRY, None))
    count = partitions.get(decision.topic, 0) if decision.topic is not None else 0
    return decision, kind, reason, partition_for(decision.partition, count)


def route_batches(batches: Iterator[pa.RecordBatch], *, policy: RetryPolicy, group: str,
                  partitions: Mapping[str, int]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body over failed rows: each becomes its retry or dead-letter copy."""
    routed: set[Coordinates] = set()
    for batch in batches:
        out: dict[str, list[Any]] = {name: [] for name in ROUTED_SCHEMA.names}
        first = FirstFailures(policy, group, now_ms())
        with gc_paused():
            for record, error in failures(batch, routed):
                decision, kind, reason, partition = _routed(record, error, first, partitions)
                out["topic"].append(decision.topic)
                out["source_topic"].append(record.topic)
                out["key"].append(record.key)
                out["value"].append(record.value)
                out["headers"].append([{"key": k, "value": v} for k, v in decision.headers])
                out["partition"].append(partition)
                out["kind"].append(kind)
                out["reason"].append(reason)
                out["attempt"].append(decision.attempt)
                out["source_attempt"].append(_source_attempt(record, decision))
            copies = pa.RecordBatch.from_pydict(out, schema=ROUTED_SCHEMA)
        yield copies


@dataclass(frozen=True)
class Decide:
    """mapInArrow body over failed rows: whether each record's route is its dead-letter topic,
    decided as RouteAndProduce decides at the same `now_ms`, and nothing produced."""

    policy: RetryPolicy
    group: str
    partitions: Mapping[str, int]
    now_ms: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        routed: set[Coordinates] = set()
        for batch in batches:
            first = FirstFailures(self.policy, self.group, self.now_ms)
            out: dict[str, list[Any]] = {name: [] for name in DECIDED_SCHEMA.names}
            for record, error in failures(batch, routed):
                kind = _routed(record, error, first, self.partitions)[1]
                out["topic"].append(record.topic)
                out["partition"].append(record.partition)
                out["offset"].append(record.offset)
                out["dead"].append(kind == DEAD_LETTER)
            yield pa.RecordBatch.from_pydict(out, schema=DECIDED_SCHEMA)


@dataclass(frozen=True)
class RouteAndProduce:
    """mapInArrow body over failed rows that routes each and produces its copy in the same task,
    then yields one row per (kind, reason, attempt, topic) with how many records went that way.

    One Spark job instead of three (route, write, count): a task returns only once the broker
    acknowledged every copy it produced, and raises otherwise, so the batch then fails and is
    retried before its offsets are committed. A class at module level is pickled by reference,
    so executors use the writer's producer cache."""

    policy: RetryPolicy
    group: str
    partitions: Mapping[str, int]
    connection: kafka.Connection
    timeout_s: float = 30.0
    # Copies a replayed batch already wrote before it was cut short (see ledger).
    already: frozenset[CopyKey] = frozenset()
    # The batch's routing marks in the ledger, where its copies start.
    marks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # The time routing decides at (retries' due times, max_retry_period), when the brake
    # decided the same rows before: both then see the same routes. Now, per task, without.
    now_ms: int | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts: Counter[tuple[str, str | None, int, str | None, str, int]] = Counter()
        already = self.already | self._written_by_earlier_attempts()

        def copies() -> Iterator[kafka.OutRecord]:
            routed: set[Coordinates] = set()
            for batch in batches:
                first = FirstFailures(self.policy, self.group,
                                      now_ms() if self.now_ms is None else self.now_ms)
                for record, error in failures(batch, routed):
                    decision, kind, reason, partition = _routed(record, error, first,
                                                                self.partitions)
                    counts[(kind, reason, decision.attempt, decision.topic, record.topic,
                            _source_attempt(record, decision))] += 1
                    if decision.topic is not None and not (
                            already and copy_key(decision.headers) in already):
                        yield kafka.OutRecord(decision.topic, record.value, record.key,
                                              decision.headers, partition)

        with gc_paused():
            produce_cached(self.connection, copies(), self.timeout_s, shrink=slimmed)
        yield pa.RecordBatch.from_pylist(
            [{"kind": kind, "reason": reason, "attempt": attempt, "topic": topic, "count": n,
              "source_topic": source, "source_attempt": source_attempt}
             for (kind, reason, attempt, topic, source, source_attempt), n in counts.items()],
            schema=ROUTE_COUNTS_SCHEMA)

    def _written_by_earlier_attempts(self) -> frozenset[CopyKey]:
        """A task Spark runs again after it failed (a copy refused, an executor lost) would copy
        again what its earlier attempt had written: those are found after the batch's marks."""
        from pyspark import TaskContext

        task = TaskContext.get()
        if not self.marks or task is None or task.attemptNumber() == 0:
            return frozenset()
        return frozenset(copies_since(self.connection, self.marks, self.group))


def _source_attempt(record: Record, decision: Route) -> int:
    """The attempt the failed record was on: the one before its route's, except for a malformed
    dead letter, which restarts at 1 (and whose headers may not be readable)."""
    if isinstance(decision, DeadLetter) and decision.reason == "malformed":
        try:
            return h.read_delivery(record.headers).attempt
        except MalformedHeader:
            return -1
    return decision.attempt - 1
