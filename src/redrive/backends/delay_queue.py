"""The delay-queue retry backend: failed records wait in the delay service's shared tiers and come
back to the very topic they were read from, marked for the group that failed them.

No group gets retry topics of its own: whatever the number of groups and delays, the cluster holds
the main topics, the tiers, and one dead-letter topic per group and main topic. A retry copy
carries `redrive-target` (the topic it failed on) and `redrive-group` (the failing group); the
delay service forwards it there when due, the failing group handles it with its attempt count
carried on, and every other group reading that topic skips it as another group's record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from confluent_kafka.admin import AdminClient

from redrive import headers as h
from redrive import kafka, topics
from redrive.backends.contract import BoundBackend, RetryBackend
from redrive.clock import now_ms
from redrive.delay.tiers import DEFAULT_TIERS, Tiers
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.record import Record
from redrive.routing import DeadLetter, Route


class DelayQueue(RetryBackend):
    """Failed records go through the delay service's tiers back to their topic (seed 000's flow).

    The delay service (`redrive delay run`, or `redrive.delay.DelayService`) must run with the
    same tiers; they must exist on the cluster when the runtime starts.
    """

    def __init__(self, tiers: Tiers = DEFAULT_TIERS) -> None:
        if not isinstance(tiers, Tiers):
            raise InvalidArgument("tiers", tiers, "must be a redrive.delay.Tiers "
                                  "(Tiers.of(['1s', '10s', ...]) or Tiers.parse('1s,10s'))")
        self.tiers = tiers

    def bind(self, group: str) -> BoundBackend:
        return _DelayQueueBound(self.tiers, group)

    def plan(self, plan: topics.TopicPlan) -> topics.TopicPlan:
        return own_topics(plan)

    def __repr__(self) -> str:
        return f"DelayQueue(tiers={[tier.topic for tier in self.tiers.tiers]})"


def own_topics(plan: topics.TopicPlan) -> topics.TopicPlan:
    """A group's own topics under this backend: its main topic and dead-letter topic."""
    return replace(plan, retry_topics=())


class _DelayQueueBound(BoundBackend):
    def __init__(self, tiers: Tiers, group: str) -> None:
        self.tiers = tiers
        self.group = group

    def consumed_topics(self, plan: topics.TopicPlan) -> list[str]:
        return [plan.topic]

    def prepare(self, admin: AdminClient, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        self.check(kafka.topic_partitions(admin))
        warnings: list[str] = []
        for plan in plans.values():
            report = topics.ensure_topics(admin, own_topics(plan))
            warnings.extend(str(mismatch) for mismatch in report.mismatched)
        return warnings

    def check(self, existing: Mapping[str, int]) -> None:
        for tier in self.tiers.topics:
            if tier not in existing:
                # The service creates its tiers when it starts; a runtime must not guess their
                # partition count or retention.
                raise UnknownTopic(tier, "a delay tier of the DelayQueue backend: start the "
                                         "delay service (redrive delay run) with the same tiers "
                                         "first")

    def copy_topics(self, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        # A copy already due when it is made goes straight back to its main topic.
        return [*self.tiers.topics, *(plan.topic for plan in plans.values()),
                *(plan.dead_letter for plan in plans.values() if plan.dead_letter is not None)]

    def waits(self, plans: Mapping[str, topics.TopicPlan]) -> dict[str, int]:
        return self.tiers.waits

    def failed(self, record: Record, decision: Route,
               partitions: Mapping[str, int]) -> kafka.OutRecord | None:
        if isinstance(decision, DeadLetter):
            if decision.topic is None:
                return None
            partition = topics.partition_for(decision.partition,
                                             partitions.get(decision.topic, 0))
            # A record that came back through the tiers no longer has anywhere to go.
            return kafka.OutRecord(decision.topic, record.value, record.key,
                                   h.replace(decision.headers, {h.TARGET: None}), partition)
        now = now_ms()
        hop = self.tiers.next_hop(decision.due_ms - now)
        # A copy read from a retry topic of an earlier policy goes back to that topic's main.
        target = topics.retried_topic(record.topic, self.group) or record.topic
        headers = h.replace(decision.headers, {h.TARGET: target})
        # Stamped with the hop's start: the service counts the hop's wait from the timestamp.
        return kafka.OutRecord(target if hop is None else hop.topic, record.value,
                               record.key, headers, timestamp_ms=now)
