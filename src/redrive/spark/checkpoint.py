"""The identity of a streaming query, kept in its checkpoint.

Spark numbers a query's micro-batches from 0, and a new checkpoint, even at a path where an
earlier one was deleted, numbers them from 0 again. What makes a batch id mean one batch is the
query's id, which Spark writes to `<checkpoint>/metadata` when the checkpoint is made and keeps
across every restart from it. The ledger's entries and a sink's rows carry it beside the batch
id, so a new query's batch 0 is never taken for an earlier query's.

Reading the metadata is a small Spark job (about 80 ms here), which `route_failures` would pay
on every micro-batch. On a classic session, foreachBatch runs on the query's own thread, where
Spark keeps the running query's id as a local property: once the checkpoint's metadata was read
and found to name that query, later calls of the process take it from there. A query made
afresh at the same path has a new id, so its first call reads the metadata again.
"""

from __future__ import annotations

import json
import re
from typing import Any

from redrive.errors import InvalidArgument

_RUNNING_QUERY = "sql.streaming.queryId"  # Spark's local property on a query's own thread

# (checkpoint, query id) pairs whose metadata this process read and found to name the query
# running on the calling thread.
_confirmed: set[tuple[str, str]] = set()


def query_id(spark: Any, checkpoint: str) -> str:
    """The id of the query whose checkpoint is at `checkpoint`, read with `spark` (on any file
    system Spark reads; on Spark Connect, the server's), or, after one such read in this
    process, from the running query's thread (see the module)."""
    running = _running_query(spark)
    if running is not None and (checkpoint, running) in _confirmed:
        return running
    found = _read(spark, checkpoint)
    if found == running:
        _confirmed.add((checkpoint, running))
    return found


def _running_query(spark: Any) -> str | None:
    """The id of the streaming query running on this thread, where a classic session says."""
    try:
        running = spark.sparkContext.getLocalProperty(_RUNNING_QUERY)
    except Exception:  # Spark Connect has no SparkContext, and says so in its own ways
        return None
    return running if isinstance(running, str) and running else None


# What Hadoop reads as a glob in a path given to a read; a checkpointLocation takes them as
# they are (`cp[1]` would otherwise read `cp1`'s metadata, another query's).
_GLOB = re.compile(r"([\\{}\[\]*?^])")


def _read(spark: Any, checkpoint: str) -> str:
    path = _GLOB.sub(r"\\\1", checkpoint.rstrip("/")) + "/metadata"
    try:
        rows = spark.read.text(path).limit(1).collect()
    except Exception as exc:  # Spark's errors have no common base across Connect and classic
        if "PATH_NOT_FOUND" not in str(exc):
            raise
        rows = []
    try:
        found = json.loads(rows[0][0]).get("id") if rows else None
    except (ValueError, AttributeError):
        found = None
    if not isinstance(found, str) or not found:
        raise InvalidArgument("checkpoint", checkpoint,
                              "holds no streaming query's metadata: pass the running query's "
                              "checkpointLocation")
    return found
