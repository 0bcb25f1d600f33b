"""A Spark query's dead-letter brake.

A query reads its partitions as one and Spark commits a micro-batch whole, so a partition cannot
be held at a record while the others go on, as RetryingConsumer holds it. Instead, before anything
of a batch is copied, its records are judged per partition in offset order, carried on from the
query's earlier batches; a dead letter that would pass the limit stops its partition: the stop is
written to the control topic and the batch fails, so Spark commits none of it.
`RetryPipeline.run()` then waits for `redrive resume` or the cool-off and starts the query again
from its checkpoint, where the batch runs again with the released partition's counts started
afresh at the record that tripped. A query started while a stop stands fails its first batch at
once, whoever starts it.

What judging needs, with a limit only: the failed rows' routes, decided at the instant routing
then uses (so both see the same routes), from the rows routing fetched already where they are few,
else by a job; and the batch's records per partition: where the batch has no dead letters, the
counts it makes anyway (the DataFrame form's observed tally, the per-record forms' outcome count),
else their offsets, fetched by a job, whose places in the order count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from redrive import control, kafka, topics
from redrive.clock import now_ms
from redrive.errors import DeadLetterBrakeTripped
from redrive.kafka.records import PartitionKey
from redrive.policy import DeadLetterLimit
from redrive.policy.brake import Window
from redrive.spark import tasks
from redrive.spark.sql import functions

# A partition's records in this batch: their offsets where the order matters (the batch has dead
# letters), or just how many there are.
Records = Mapping[PartitionKey, "np.ndarray[Any, Any] | int"]


def judge(windows: Mapping[PartitionKey, Window], limit: DeadLetterLimit, records: Records,
          failed: Mapping[PartitionKey, Mapping[int, bool]]
          ) -> tuple[dict[PartitionKey, int], dict[PartitionKey, Window]]:
    """Each partition's records in offset order, after its `windows`: the failed ones
    (`failed`: offset -> dead-lettered; a retry is not finished, so not counted) and the rest,
    successes. Returns the offset of the dead letter that would pass `limit` per partition where
    one would, and the windows after the batch of the others (those given are not changed)."""
    trips: dict[PartitionKey, int] = {}
    after: dict[PartitionKey, Window] = {}
    for tp in sorted(set(records) | set(failed)):
        known = windows.get(tp)
        window = known.copy() if known is not None else Window(limit.window)
        fails = sorted(failed.get(tp, {}).items())
        found = records.get(tp, 0)
        if isinstance(found, int):
            if any(dead for _, dead in fails):
                raise ValueError(f"{tp}: dead letters need the records' offsets")
            if found > len(fails):
                window.add(found - len(fails), False)
            after[tp] = window
            continue
        offsets = np.union1d(found, np.array([offset for offset, _ in fails], dtype=np.int64))
        places = np.searchsorted(offsets, [offset for offset, _ in fails])
        before = -1
        for (offset, dead), place in zip(fails, places.tolist(), strict=True):
            if place - before > 1:
                window.add(place - before - 1, False)
            before = place
            if not dead:
                continue
            if window.passes(limit):
                trips[tp] = offset
                break
            window.add(1, True)
        else:
            if len(offsets) - before > 1:
                window.add(len(offsets) - before - 1, False)
            after[tp] = window
    return trips, after


class QueryBrake:
    """One query's brake: its partitions' windows across its batches, staged while a batch runs
    and kept once it is done (a batch run again must not count its records twice)."""

    def __init__(self, limit: DeadLetterLimit, group: str,
                 connection: kafka.Connection) -> None:
        self.limit = limit
        self.group = group
        self.connection = connection
        self.windows: dict[PartitionKey, Window] = {}
        self._staged: dict[PartitionKey, Window] = {}
        # The batch counted last and the windows before it: a batch Spark runs again (a write
        # after routing failed) is judged again from where its first run was.
        self._counted: int | None = None
        self._before: dict[PartitionKey, Window] = {}
        # Where each released stop stood (read at the first batch): the records before it were
        # judged when it tripped, so its partition counts afresh from there.
        self._released: dict[PartitionKey, int] | None = None

    def begin(self) -> None:
        """Fail at once while a stop of the group stands (a query started again before it was
        released); else learn where released ones stood. Once a query, and again after a trip
        (route_failures' brake outlives the query run it tripped in)."""
        if self._released is not None:
            return
        standing = control.standing_stops(self.connection, self.group)
        if standing.active:
            raise tripped(self.connection, self.group, standing.active)
        self._released = dict(standing.released)

    def judge(self, counted: Any, decide: Callable[[int], pa.Table] | None,
              batch_id: int | None = None,
              counts: Mapping[PartitionKey, int] | None = None) -> int:
        """Judge a batch before its failures are copied: `counted`, the batch's records that
        finish or retry (one row per record, with topic, partition and offset), and `decide`,
        which gives its failed records' routes decided at a time (tasks.DECIDED_SCHEMA; None:
        none failed). `counts`, the same records counted per partition if known (observed as
        the batch was written), spares a job where the order does not matter. Raises
        DeadLetterBrakeTripped, its stops written, where a dead letter would pass the limit;
        else returns the time routing must decide at."""
        self.begin()
        if batch_id is not None and batch_id == self._counted:
            self.windows = dict(self._before)
        released = self._released or {}
        at = now_ms()
        failed: dict[PartitionKey, dict[int, bool]] = {}
        if decide is not None:
            decided = decide(at)
            for topic, partition, offset, dead in zip(
                    *(decided.column(name).to_pylist() for name in tasks.DECIDED_SCHEMA.names),
                    strict=True):
                if offset >= released.get((topic, partition), -1):
                    failed.setdefault((topic, partition), {}).setdefault(offset, dead)
        ordered = any(dead for found in failed.values() for dead in found.values())
        records: Records = (dict(counts) if counts is not None and not ordered
                            and not released.keys() & counts.keys()
                            else _records(counted, released, ordered))
        trips, after = judge(self.windows, self.limit, records, failed)
        if trips:
            stops = [control.Stop(self.group, topic, partition, offset,
                                  topics.retried_topic(topic, self.group) or topic, at,
                                  self.limit.cool_off_ms, self.limit.describe())
                     for (topic, partition), offset in sorted(trips.items())]
            control.write_stops(self.connection, stops)
            self._released = None  # the batch comes again once released: read how, then
            raise tripped(self.connection, self.group, stops)
        self._staged = after
        return at

    def done(self, batch_id: int | None = None) -> None:
        """The batch judged last is done: its counts stand."""
        self._counted, self._before = batch_id, dict(self.windows)
        self.windows.update(self._staged)  # copies: the windows in _before are not changed
        self._staged = {}


def _records(counted: Any, released: Mapping[PartitionKey, int], ordered: bool) -> Records:
    """The batch's records per partition, those before a released stop left out."""
    F = functions(counted)
    frame = counted.select("topic", "partition", "offset")
    for (topic, partition), offset in released.items():
        frame = frame.where(~((F.col("topic") == topic) & (F.col("partition") == partition)
                              & (F.col("offset") < offset)))
    if not ordered:
        return {(row["topic"], row["partition"]): int(row["count"]) for row in
                frame.groupBy("topic", "partition").count().collect()}
    table = frame.toArrow()
    topics_ = np.array(table.column("topic").to_pylist(), dtype=object)
    partitions = table.column("partition").to_numpy(zero_copy_only=False)
    offsets = table.column("offset").to_numpy(zero_copy_only=False)
    found: dict[PartitionKey, np.ndarray[Any, Any]] = {}
    for topic in set(topics_.tolist()):
        of_topic = topics_ == topic
        for partition in np.unique(partitions[of_topic]).tolist():
            found[(topic, partition)] = np.unique(
                offsets[of_topic & (partitions == partition)])
    return found


def tripped(connection: kafka.Connection, group: str,
            stops: Sequence[control.Stop]) -> DeadLetterBrakeTripped:
    """The error naming `stops` and the command that releases them."""
    return DeadLetterBrakeTripped(group, [(s.topic, s.partition, s.offset) for s in stops],
                                  stops[0].limit, control.resume_command(connection, group, stops))
