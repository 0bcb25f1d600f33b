"""Rebalances while partitions are held: holds are dropped, nothing is handled early, lost or
handled twice. Eager assignment on noida-db; cooperative-sticky on Tansu (noida-db fails it)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from .conftest import FAST_GROUP, Handled, Running, produce, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]

# Tansu joins a group in about session.timeout.ms / 2 (brokers.md).
TANSU_GROUP: Mapping[str, Any] = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 200}


def failing_once(seen: Handled) -> Callable[[Record], None]:
    def handler(record: Record) -> None:
        seen.add(record)
        if int(record.value or b"0") % 3 == 0 and record.delivery.attempt == 0:
            raise RuntimeError("first try fails")
    return handler


def check_outcome(seen: Handled, values: range) -> None:
    early = [(r.value, at) for r, at in seen.calls
             if r.delivery.due_ms is not None and at < r.delivery.due_ms]
    assert early == []
    calls = Counter(seen.values())
    expected = {str(n).encode(): 2 if n % 3 == 0 else 1 for n in values}
    assert calls == expected  # each once per attempt: none lost, none handled twice


def test_revoke_while_held_drops_the_hold_and_the_new_owner_waits(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("revoke")
    policy = RetryPolicy(backoff=Backoff.fixed("1500ms"), attempts=2)
    seen_a, seen_b = Handled(), Handled()
    for partition in (0, 1):
        produce(bootstrap, topic, [str(n).encode() for n in range(partition, 12, 2)],
                partition=partition)
    a = running(RetryingConsumer(bootstrap, topic, group, policy, failing_once(seen_a),
                                 config=FAST_GROUP))
    wait_until(lambda: a.consumer.metrics.value("redrive_paused_partitions") == 2, 20,
               "both retry partitions held by the first member")
    b = running(RetryingConsumer(bootstrap, topic, group, policy, failing_once(seen_b),
                                 config=FAST_GROUP))
    wait_until(lambda: b.consumer.metrics.value("redrive_rebalances_total", kind="assign") >= 1,
               20, "the second member's assignment")
    wait_until(lambda: a.total("redrive_processed_total") + b.total("redrive_processed_total")
               == 12, 20, "all 12 processed")
    a.stop()
    b.stop()
    assert a.consumer.metrics.value("redrive_rebalances_total", kind="revoke") >= 1
    assert a.total("redrive_retried_total") == 4  # the first pass was all the first member's
    merged = Handled(calls=seen_a.calls + seen_b.calls)
    check_outcome(merged, range(12))
    assert seen_b.calls, "the second member got no partition"


@pytest.fixture(params=[
    # Not run: the stuck rebalance also blocks both members' close() for about a minute.
    pytest.param("noida-db", marks=pytest.mark.xfail(
        run=False, reason="noida-db deviation (brokers.md): with cooperative-sticky, revoked "
                          "partitions are never handed to the new member")),
    "tansu",
])
def coop_broker(request: pytest.FixtureRequest) -> tuple[str, Mapping[str, Any]]:
    if request.param == "tansu":
        return request.getfixturevalue("tansu").bootstrap, TANSU_GROUP
    return request.getfixturevalue("bootstrap"), FAST_GROUP


def test_cooperative_sticky_rebalance_while_partitions_are_held(
        coop_broker: tuple[str, Mapping[str, Any]], running: Start) -> None:
    bootstrap, group_config = coop_broker
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"coop-{suffix}", f"coop-{suffix}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: 4})
    config = {**group_config, "partition.assignment.strategy": "cooperative-sticky"}
    policy = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=2)
    seen_a, seen_b = Handled(), Handled()
    for partition in range(4):
        produce(bootstrap, topic, [str(n).encode() for n in range(partition, 24, 4)],
                partition=partition)
    a = running(RetryingConsumer(bootstrap, topic, group, policy, failing_once(seen_a),
                                 config=config))
    wait_until(lambda: a.total("redrive_retried_total") == 8, 20, "8 first failures")
    b = running(RetryingConsumer(bootstrap, topic, group, policy, failing_once(seen_b),
                                 config=config))
    wait_until(lambda: b.consumer.metrics.value("redrive_rebalances_total", kind="assign") >= 1
               and a.consumer.metrics.value("redrive_rebalances_total", kind="revoke") >= 1,
               15, "partitions moved to the second member")
    time.sleep(0.5)
    for partition in range(4):
        produce(bootstrap, topic, [str(n).encode() for n in range(24 + partition, 48, 4)],
                partition=partition)
    wait_until(lambda: a.total("redrive_processed_total") + b.total("redrive_processed_total")
               == 48, 30, "all 48 processed")
    a.stop()
    b.stop()
    check_outcome(Handled(calls=seen_a.calls + seen_b.calls), range(48))
    assert seen_b.calls and any(int(r.value or b"0") >= 24 for r, _ in seen_a.calls), \
        "both members should handle records after the rebalance"
