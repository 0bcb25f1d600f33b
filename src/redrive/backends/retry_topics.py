"""The default retry backend: failed records go to the group's retry and dead-letter topics, which
the runtime reads too (see `redrive.topics.plan` for their names)."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka.admin import AdminClient

from redrive import kafka, topics
from redrive.backends.contract import BoundBackend, RetryBackend
from redrive.record import Record
from redrive.routing import Route


class RetryTopics(RetryBackend):
    """Failed records go to the group's retry topics and dead-letter topic (the default)."""

    def bind(self, group: str) -> BoundBackend:
        return _TopicsBound()

    def __repr__(self) -> str:
        return "RetryTopics()"


class _TopicsBound(BoundBackend):
    def prepare(self, admin: AdminClient, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        warnings: list[str] = []
        for plan in plans.values():
            report = topics.ensure_topics(admin, plan)
            warnings.extend(str(mismatch) for mismatch in report.mismatched)
        return warnings

    def copy_topics(self, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        return [name for plan in plans.values() for name in plan.created_topics]

    def waits(self, plans: Mapping[str, topics.TopicPlan]) -> dict[str, int]:
        return {name: wait for plan in plans.values() for name, wait in plan.waits.items()}

    def failed(self, record: Record, decision: Route,
               partitions: Mapping[str, int]) -> kafka.OutRecord | None:
        if decision.topic is None:
            return None
        partition = topics.partition_for(decision.partition, partitions.get(decision.topic, 0))
        return kafka.OutRecord(decision.topic, record.value, record.key, decision.headers,
                               partition)
