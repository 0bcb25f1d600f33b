"""The retry-backend contract: where a runtime sends failed records, and what it asks first.

`RetryTopics` (the default) copies failed records to the group's retry and dead-letter topics,
which the runtime also reads. `redrive.store.StoreBackend` keeps them in a database instead; the
store's scheduler republishes each when due to the topic the group reads, and the runtime reports
how it went. The interface lives here, below the runtimes, so a runtime never depends on the store.

A runtime binds a backend to its group once and then, per batch: asks `admit` before calling the
handler, reports `succeeded` or `failed` (with the routing decision), and calls `flush` before it
commits offsets, so that a committed offset always has its outcome recorded (or copied) first.

A runtime whose backend overrides `prefetch` first hands it the batch's records that carry
redrive headers (every record, for a `sequential` backend), before any of their `admit` calls, so
that the backend can look them all up at once instead of once per record. It is an optimisation
only: `admit` must give the same verdicts for records it was not given, or if it is never called.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient

from redrive import kafka, topics
from redrive.policy import RetryPolicy
from redrive.record import Record
from redrive.routing import Route


class Verdict(enum.Enum):
    PROCESS = "process"
    DUPLICATE = "duplicate"  # already handled or superseded: skip it and move on
    PARKED = "parked"  # kept in the store behind an earlier record with the same key


class BoundBackend(abc.ABC):
    """A backend bound to one runtime's group; one batch at a time, from one thread."""

    transactions_supported = True
    # True when admit() must see every record in order, as it is handled (per-key ordering):
    # runtimes that handle a batch's records in parallel cannot offer that.
    sequential = False

    def consumed_topics(self, plan: topics.TopicPlan) -> list[str]:
        """The topics the group reads for one main topic."""
        return plan.consumed_topics

    def prepare(self, admin: AdminClient, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        """Create what the group needs on the cluster; return warnings to log."""
        return []

    def check(self, existing: Mapping[str, int]) -> None:
        """Raise UnknownTopic for a topic the group needs and never creates itself, `existing`
        being the cluster's topics (checked whether or not the runtime creates topics)."""
        return None

    def copy_topics(self, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        """The topics `failed` writes copies to: a Spark batch run again after a crash finds
        there what its first run copied, not to copy it twice."""
        return []

    def waits(self, plans: Mapping[str, topics.TopicPlan]) -> dict[str, int]:
        """The topics the group's copies wait in, each with the longest a copy waits there
        (ms): their retention must be longer (see redrive.retention)."""
        return {}

    def policy_for(self, topic: str, default: RetryPolicy) -> RetryPolicy:
        return default

    def prefetch(self, records: Sequence[Record]) -> None:
        """Look up, at once, what `admit` will need for these records of the coming batch; what
        an earlier call fetched is replaced."""
        return None

    def admit(self, record: Record) -> Verdict:
        return Verdict.PROCESS

    def succeeded(self, record: Record) -> None:
        """The handler finished this record."""
        return None

    @abc.abstractmethod
    def failed(self, record: Record, decision: Route,
               partitions: Mapping[str, int]) -> kafka.OutRecord | None:
        """Take a failed record's routing decision; return the copy to produce, if any."""

    def flush(self) -> None:
        """Make this batch's outcomes durable; raises if they could not be."""
        return None

    def discard(self) -> None:
        """Forget this batch's outcomes: the runtime rewinds and handles its records again."""
        return None


class RetryBackend(abc.ABC):
    @abc.abstractmethod
    def bind(self, group: str) -> BoundBackend: ...
