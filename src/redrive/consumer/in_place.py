"""In-place (stateful) retry budgets, per partition, in memory.

An error the policy marks IN_PLACE is first retried on the same partition: the runtime pauses the
partition, seeks back to the record and tries it again after the in-place backoff, up to
`InPlace.retries` times, and only then routes it to a retry topic like any retryable error. Only
the head record of a partition can be in this state, so one entry per partition is enough.

The count lives in this process only, as in Spring Kafka's stateful retry: when the partition is
revoked or lost, its entry is dropped, and the member that gets the partition next starts the
record's in-place budget from zero. A record can therefore be retried in place more often than the
budget across rebalances, never less; its non-blocking attempts (carried in headers) are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable

from redrive.kafka.records import PartitionKey


class InPlaceRetries:
    def __init__(self) -> None:
        self._failures: dict[PartitionKey, tuple[int, int]] = {}  # tp -> (offset, failures)

    def failures(self, tp: PartitionKey, offset: int) -> int:
        """In-place failures so far of the record at `offset` (0 if it is not the one tracked)."""
        tracked = self._failures.get(tp)
        return tracked[1] if tracked is not None and tracked[0] == offset else 0

    def fail(self, tp: PartitionKey, offset: int, budget: int) -> int | None:
        """Count a failure; return the number of the in-place retry to make, or None if the
        record's `budget` is spent (the caller then routes the record and clears the entry)."""
        failures = self.failures(tp, offset) + 1
        if failures > budget:
            return None
        self._failures[tp] = (offset, failures)
        return failures

    def clear(self, tp: PartitionKey) -> None:
        self._failures.pop(tp, None)

    def drop(self, tps: Iterable[PartitionKey]) -> None:
        for tp in tps:
            self._failures.pop(tp, None)

    def __len__(self) -> int:
        return len(self._failures)
