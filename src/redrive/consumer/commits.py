"""Copies confirmed in the background, offsets committed strictly in batch order.

After a batch is handled, its retry and dead-letter copies are produced without waiting, and the
batch waits here with the offsets it may commit while the runtime goes on with the next batch. The
offsets of a batch are handed out for commit only once its copies, and those of every earlier
batch, are acknowledged by the broker: commits move forward in batch order on every partition and
never past a record whose copy is not acknowledged.

When a delivery fails (or stays unconfirmed past the timeout), the first unconfirmed batch and
every later one are dropped, and `settle` says where to seek each of their partitions back to. Of
the failed batch, each partition keeps the records before its first copy not acknowledged: they
are committed, and the partition is sought back to that copy's record (a refused copy is refused
again each time its record comes back: the records before it would otherwise be handled again,
and copied again, with it). The later batches' partitions go back to the earliest record they
hold. What is handled again is at-least-once: copies already written may be written twice, never
lost.

Pure: no clients, no clock of its own, so the rules are unit-tested on their own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any

from redrive.consumer.batch import Copy
from redrive.errors import DeliveryFailed
from redrive.kafka.produce import delivery_failed
from redrive.kafka.records import PartitionKey

# What became of one copy of a Pending batch.
WAITING, LANDED, FAILED = 0, 1, 2


@dataclass(eq=False)
class Pending:
    """One handled batch whose offsets wait for its copies to be acknowledged."""

    offsets: dict[PartitionKey, int]  # what to commit: the next offset per partition
    first: dict[PartitionKey, int]  # the batch's first record per partition (for a rewind)
    copies: list[Copy] = field(default_factory=list)
    since: float = 0.0  # when its copies were produced (monotonic seconds), for the timeout
    waiting: int = 0  # copies produced and not yet reported on
    error: DeliveryFailed | None = None
    states: bytearray = field(init=False)  # per copy; one with no record has nothing to wait for

    def __post_init__(self) -> None:
        self.states = bytearray(WAITING if copy.record is not None else LANDED
                                for copy in self.copies)

    def reporter(self, index: int) -> Callable[[Any, Any], None]:
        """The producer's delivery callback for copy `index`."""
        return partial(self._report, index)

    def sent(self) -> None:
        self.waiting += 1

    def _report(self, index: int, err: Any, msg: Any) -> None:
        self.waiting -= 1
        if err is None:
            self.states[index] = LANDED
            return
        self.states[index] = FAILED
        if self.error is None:
            self.error = delivery_failed(str(msg.topic()), msg.partition(), err)

    def fail(self, error: DeliveryFailed, index: int | None = None) -> None:
        """A copy (`index`, or the batch as a whole) could not even be produced: the batch fails
        as if its delivery had."""
        if index is not None:
            self.states[index] = FAILED
        if self.error is None:
            self.error = error

    def expire(self, timeout_s: float) -> None:
        if self.waiting > 0 and self.error is None:
            self.error = DeliveryFailed(topic_of(self.copies), None,
                                        f"{self.waiting} record(s) unconfirmed after "
                                        f"{timeout_s}s", unanswered=True)

    def keep(self, settled: Settled) -> None:
        """Into `settled`, what of this failed batch stands (see the module): the commits, the
        copies they confirm, the rewinds, and the partitions whose copies failed."""
        stop: dict[PartitionKey, int] = {}
        # A partition's copies are in the order of its records: the first not landed is the
        # earliest, and every landed one before it is kept. The copies still unanswered are
        # not waited for: the batches behind this one are handled meanwhile, only to be dropped.
        for copy, state in zip(self.copies, self.states, strict=True):
            if state == FAILED:
                settled.culprits.add(copy.tp)
            if copy.tp in stop:
                continue
            if state == LANDED:
                settled.confirmed.append(copy)
            else:
                stop[copy.tp] = copy.offset
        for tp, first in self.first.items():
            end = stop.get(tp, self.offsets.get(tp, first))
            if end > first:
                settled.commit[tp] = end
            if tp in stop or tp not in self.offsets:
                settled.rewind[tp] = end


@dataclass
class Settled:
    commit: dict[PartitionKey, int] = field(default_factory=dict)  # safe to commit now
    confirmed: list[Copy] = field(default_factory=list)  # copies acknowledged, to count
    rewind: dict[PartitionKey, int] = field(default_factory=dict)  # seek back after a failure
    error: DeliveryFailed | None = None
    # The partitions whose copies failed: the batches behind the failed one only follow it.
    culprits: set[PartitionKey] = field(default_factory=set)


class CommitPipeline:
    def __init__(self) -> None:
        self._pending: deque[Pending] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, pending: Pending) -> None:
        self._pending.append(pending)

    @property
    def head(self) -> Pending | None:
        return self._pending[0] if self._pending else None

    def expire(self, now_s: float, timeout_s: float) -> None:
        """Fail the oldest batch if its copies are still unconfirmed `timeout_s` after sending."""
        head = self.head
        if head is not None and head.waiting > 0 and now_s - head.since >= timeout_s:
            head.expire(timeout_s)

    def expire_all(self, timeout_s: float) -> None:
        """Fail every batch still waiting (after a flush that timed out)."""
        for pending in self._pending:
            pending.expire(timeout_s)

    def settle(self, exclude: Iterable[PartitionKey] = ()) -> Settled:
        """Take the acknowledged batches from the front, in order, and a failed one with all
        behind it. Offsets of `exclude`d partitions (lost ones) are not handed out for commit."""
        settled = Settled()
        pending = self._pending
        while pending:
            head = pending[0]
            if head.error is not None:
                settled.error = head.error
                head.keep(settled)
                for dropped in islice(pending, 1, None):
                    for tp, offset in dropped.first.items():
                        settled.rewind.setdefault(tp, offset)
                pending.clear()
                break
            if head.waiting > 0:
                break
            pending.popleft()
            settled.commit.update(head.offsets)
            settled.confirmed.extend(head.copies)
        skip = set(exclude)
        if skip:
            settled.commit = {tp: o for tp, o in settled.commit.items() if tp not in skip}
        return settled


def topic_of(copies: Iterable[Copy]) -> str:
    return next((c.record.topic for c in copies if c.record is not None), "<unconfirmed>")

