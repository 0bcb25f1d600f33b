"""The identity of a streaming query, kept in its checkpoint.

Spark numbers a query's micro-batches from 0, and a new checkpoint, even at a path where an
earlier one was deleted, numbers them from 0 again. What makes a batch id mean one batch is the
query's id, which Spark writes to `<checkpoint>/metadata` when the checkpoint is made and keeps
across every restart from it. The ledger's entries and a sink's rows carry it beside the batch
id, so a new query's batch 0 is never taken for an earlier query's.
"""

from __future__ import annotations

import json
from typing import Any

from redrive.errors import InvalidArgument


def query_id(spark: Any, checkpoint: str) -> str:
    """The id of the query whose checkpoint is at `checkpoint`, read with `spark` (on any file
    system Spark reads; on Spark Connect, the server's)."""
    path = checkpoint.rstrip("/") + "/metadata"
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
