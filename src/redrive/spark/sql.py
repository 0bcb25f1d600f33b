"""Spark SQL's functions for a given DataFrame or session, and a transform written in SQL.

`pyspark.sql.functions` builds classic columns unless the whole process is in Connect mode, and a
process may hold a classic session and a Connect client at once (a test suite, a notebook moving
to Connect); a column of the other kind fails at once. So redrive builds each expression with the
functions of the DataFrame it goes into.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from redrive.errors import InvalidArgument


def functions(owner: Any) -> ModuleType:
    """The functions module matching `owner`, a DataFrame or a session."""
    if type(owner).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as classic_functions

    return classic_functions


def is_remote(owner: Any) -> bool:
    """Whether `owner` (a DataFrame or session) belongs to a Spark Connect client."""
    return type(owner).__module__.startswith("pyspark.sql.connect")


def observation(owner: Any) -> Any:
    """A new Observation (for `DataFrame.observe`) of `owner`'s kind, classic or Connect."""
    if is_remote(owner):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation()
    from pyspark.sql import Observation

    return Observation()


def observed(observation_: Any) -> dict[str, Any] | None:
    """The observation's metrics, or None when no action computed them: never waits.

    A classic Observation's `get` waits until an action over the observed rows has run, forever
    if none does; its Java side says whether one has, without waiting. A Connect client's has
    its metrics with the action's answer, or raises."""
    from pyspark.errors import PySparkAssertionError

    java = getattr(observation_, "_jo", None)
    if java is not None and not java.future().isCompleted():
        return None
    try:
        metrics: dict[str, Any] = observation_.get
    except PySparkAssertionError:
        return None
    return metrics



def quoted(column: str) -> str:
    """A column's name as Spark reads it literally: unquoted, `a.b` is field b of column a."""
    return "`" + column.replace("`", "``") + "`"


def error_set(frame: Any, error_column: str) -> Any:
    """Whether a row's error column says it failed: not null, and not a struct whose type and
    message are both null, which is what `struct(when(bad, ...), when(bad, ...))` makes of a
    row that did not fail."""
    error = functions(frame).col(quoted(error_column))
    return error.isNotNull() & (error.getField("type").isNotNull()
                                | error.getField("message").isNotNull())


def hold(frame: Any, *, as_rows: bool = True) -> Any:
    """`frame`, kept by the first action over it for the actions after.

    As rows, a local checkpoint that is not eager, where `persist` builds Spark's in-memory
    columns: a 1M-record batch of the DataFrame form, written and then read again for routing
    (its transform's output persisted), took 7.2 s that way against 9.2 s with the batch
    persisted too (docs/benchmarks.md). A local checkpoint cannot be computed again if its
    blocks are lost (an executor gone): the action then fails with
    CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND (see `lost_held_rows`), and the caller holds the batch
    with `as_rows=False`, persisted, to run it again. Release it with `release`.
    """
    return frame.localCheckpoint(eager=False) if as_rows else frame.persist()


def release(held: Any) -> None:
    """Drop what `hold` kept. A classic session's blocks go now. On Spark Connect the server
    drops its reference to a checkpoint when the client's is collected, and the blocks go
    with the server's next garbage collection of it."""
    java = getattr(held, "_jdf", None)
    logical = java.queryExecution().logical() if java is not None else None
    if logical is not None and logical.getClass().getSimpleName() == "LogicalRDD":
        logical.rdd().unpersist(False)
    else:
        held.unpersist()


def lost_held_rows(exc: BaseException) -> bool:
    """Whether an action failed because blocks of a held batch (a local checkpoint) are gone."""
    return "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in str(exc)


# How a transform given as SQL names the admitted batch: `SELECT ... FROM {batch}`.
BATCH_NAME = "batch"


class SqlTransform:
    """A transform written as one Spark SQL query over the admitted batch, named `{batch}` in it
    (other braces doubled, as in `str.format`). An object, not a closure, so Spark Connect
    ships it to the server's Python like a function of the user's module."""

    def __init__(self, query: str) -> None:
        if "{" + BATCH_NAME + "}" not in query:
            raise InvalidArgument("transform", query, "a SQL transform reads the admitted batch "
                                  "as {batch}: SELECT ... FROM {batch}")
        self.query = query

    def __call__(self, frame: Any) -> Any:
        return frame.sparkSession.sql(self.query, **{BATCH_NAME: frame})

    def __repr__(self) -> str:
        return f"SqlTransform({self.query!r})"
