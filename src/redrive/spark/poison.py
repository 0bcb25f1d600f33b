"""Records a DataFrame transform cannot compute at all, found and routed as failures.

A transform reports expected failures in its error column, but Spark itself may fail on a value:
a cast of 'abc' to int under ANSI mode (on by default since Spark 4), a Python UDF that raises.
Then the whole job fails, the query stops, and a restart meets the same record again: one bad
record blocks its partition for good, which is what redrive is for. So when a batch's write fails
and the transform alone fails on the batch's records too, the body narrows it down: it computes
the transform over each partition's offset range, halves every range that fails, and ends with
the single records that fail on their own (about two jobs per halving, so a few seconds for one
record in a large batch). Those records leave the transform's input and are routed by the policy
with the error Spark raised; the batch then runs again without them.

A write that fails while the transform alone computes (a sink that is down) is raised as before;
so is a failure that no single record explains, and one with more than MAX_RECORDS records to
isolate, which is a transform to fix rather than records to route.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from redrive.errors import RedriveError
from redrive.record import ErrorInfo
from redrive.spark import tasks
from redrive.spark.sql import functions, lost_held_rows

log = logging.getLogger("redrive.spark")

Coordinates = tasks.Coordinates
MAX_RECORDS = 16
TRACE_CHARS = 8_000
# The last line of a Python worker's traceback inside a PythonException: "ValueError: bad".
_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)): ?(.*)$",
                           re.MULTILINE)


class TooManyPoisonRecords(RedriveError):
    pass


class PoisonFound(Exception):
    """Raised inside a batch attempt so that it releases what it holds before the next one."""

    def __init__(self, records: Mapping[Coordinates, ErrorInfo]) -> None:
        super().__init__(f"{len(records)} records the transform cannot compute")
        self.records = dict(records)


def error_of(exc: BaseException) -> ErrorInfo:
    """What a record failed with when the transform alone failed on it.

    A Python UDF's error is named by the Python exception it raised (so `not_retryable=ValueError`
    matches it as in the per-record form); a Spark SQL error by its condition
    (`CAST_INVALID_INPUT`, `DIVIDE_BY_ZERO`); the Spark exception's classes follow in the chain.
    """
    text = str(exc)
    chain = ErrorInfo.from_exception(exc).chain
    found = _PYTHON_ERROR.findall(text) if type(exc).__name__ == "PythonException" else []
    if found:
        name, message = found[-1]
    else:
        name = _condition(exc) or chain[0][0]
        message = text.strip().splitlines()[0] if text.strip() else name
    return ErrorInfo(name, message, text[:TRACE_CHARS], ((name, *chain[0]), *chain[1:]))


def _condition(exc: BaseException) -> str | None:
    for getter in ("getCondition", "getErrorClass"):
        method: Callable[[], Any] | None = getattr(exc, getter, None)
        if method is not None:
            try:
                value = method()
            except Exception:  # a captured exception whose JVM side is gone
                continue
            if value:
                return str(value)
    return None


def find(transform: Callable[[Any], Any], candidates: Any, *, already: int = 0
         ) -> dict[Coordinates, ErrorInfo]:
    """The records of `candidates` on which `transform` fails by itself, with their errors;
    empty when it computes over all of them, or when a failure is not one record's own.
    `already`: how many the batch has had found before."""
    with _quiet(_QUERY_CONTEXT_LOGGERS):
        return _find(transform, candidates, already)


# PySpark logs every SQL error it raises, with its whole JVM trace, on these loggers: the
# search's failures are expected, and the write's failure before it was logged already.
_QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


@contextlib.contextmanager
def _quiet(names: Sequence[str]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before, strict=True):
            logger.disabled = disabled


def _find(transform: Callable[[Any], Any], candidates: Any, already: int
          ) -> dict[Coordinates, ErrorInfo]:
    F = functions(candidates)
    first = _failure(transform, candidates)
    if first is None or lost_held_rows(first):
        return {}
    level = [(row["topic"], row["partition"], row["low"], row["high"]) for row in
             candidates.groupBy("topic", "partition")
             .agg(F.min("offset").alias("low"), F.max("offset").alias("high")).collect()]
    found: dict[Coordinates, ErrorInfo] = {}
    jobs = 2
    # Level by level: the ranges failing at one level are disjoint and each holds a record that
    # fails (or records that fail together), so more of them than a batch may isolate ends the
    # search early. An error that fails every record (a service down behind a UDF) ends it
    # after a few levels, rather than after a search for every record.
    while level:
        failing = []
        for topic, partition, low, high in level:
            part = candidates.where((F.col("topic") == topic)
                                    & (F.col("partition") == partition)
                                    & F.col("offset").between(low, high))
            error = _failure(transform, part)
            jobs += 1
            if error is None:
                continue
            if lost_held_rows(error):
                return {}  # the batch is run again persisted (see sql.hold)
            if low < high:
                failing.append((topic, partition, low, high))
            else:
                jobs += 1
                if part.limit(1).count():  # not a gap in the offsets: the record itself
                    found[(topic, partition, low)] = error_of(error)
        if already + len(found) + len(failing) > MAX_RECORDS:
            raise TooManyPoisonRecords(
                f"more than {MAX_RECORDS} records of the batch fail the transform by themselves "
                f"(found after {jobs} Spark jobs; the first error: {error_of(first).message}); "
                "return such failures in the error column (try_cast, try_divide, a UDF that "
                "returns its error) rather than raising")
        level = [half for topic, partition, low, high in failing
                 for half in ((topic, partition, low, (low + high) // 2),
                              (topic, partition, (low + high) // 2 + 1, high))]
    log.warning("the transform cannot compute %d records (%d jobs to find them): routed as "
                "failures: %s", len(found), jobs,
                ", ".join(f"{t}[{p}]@{o} {e.type_name}" for (t, p, o), e in sorted(found.items())))
    return found


def _failure(transform: Callable[[Any], Any], frame: Any) -> BaseException | None:
    """The error computing `transform` over `frame` raises, or None: computed for nothing."""
    try:
        transform(frame).write.format("noop").mode("overwrite").save()
    except Exception as exc:
        return exc
    return None


def routing_rows(held: Any, records: Mapping[Coordinates, ErrorInfo]) -> Any:
    """The records' rows of the batch in the routing job's columns, with their errors."""
    F = functions(held)
    errors = held.sparkSession.createDataFrame(
        [(*place, *tasks.error_columns(error).values()) for place, error in records.items()],
        "topic string, partition int, offset long, error_type string, error_message string, "
        "error_trace string, error_chain string")
    return held.join(F.broadcast(errors), ["topic", "partition", "offset"]).select(
        *tasks.ROUTING_COLUMNS)
