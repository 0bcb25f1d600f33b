"""Holding partitions until a time: the bookkeeping, and the pause, seek and resume calls it makes
on the consumer (a recording stand-in here; tests/integration/kafka/test_holds.py uses a real
consumer)."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from redrive.kafka.holds import Hold, Holds, Why

A, B = ("orders", 0), ("orders.g.retry.5s", 1)


class Calls:
    """Records what Holds asks of a consumer, as (call, [(topic, partition, offset)])."""

    def __init__(self) -> None:
        self.made: list[tuple[str, list[tuple[str, int, int]]]] = []

    def _note(self, call: str, partitions: list[TopicPartition]) -> None:
        self.made.append((call, [(p.topic, p.partition, p.offset) for p in partitions]))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._note("pause", partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._note("resume", partitions)

    def seek(self, partition: TopicPartition) -> None:
        self._note("seek", [partition])


def test_holds_release_when_due_and_bound_the_poll_wait() -> None:
    holds, consumer = Holds(), Calls()
    assert holds.wait_s(1_000, 0.1) == 0.1
    holds.hold(consumer, A, Hold(7, 1_050, Why.DUE, 900))
    holds.hold(consumer, B, Hold(3, 2_000, Why.IN_PLACE, 950))
    assert consumer.made[:2] == [("pause", [("orders", 0, 7)]), ("seek", [("orders", 0, 7)])]
    assert holds.wait_s(1_000, 0.1) == pytest.approx(0.05)
    assert holds.wait_s(1_060, 0.1) == 0.0
    assert holds.oldest_since_ms() == 900  # only DUE holds count
    consumer.made.clear()
    assert holds.release_due(consumer, 1_049) == []
    assert consumer.made == []
    assert holds.release_due(consumer, 1_050) == [A]
    assert consumer.made == [("resume", [("orders", 0, -1001)])]
    assert A not in holds and B in holds and len(holds) == 1


def test_holds_released_on_revoke_resume_only_what_was_held() -> None:
    holds, consumer = Holds(), Calls()
    holds.hold(consumer, A, Hold(7, 5_000, Why.DUE, 0))
    consumer.made.clear()
    assert holds.release(consumer, [A, B]) == [A]
    assert consumer.made == [("resume", [("orders", 0, -1001)])]
    assert len(holds) == 0
    assert holds.release(consumer, [A]) == []


def test_a_brakes_hold_is_not_ended_by_a_refusal_that_rewinds_below_it() -> None:
    """A refused copy of an earlier record of the batch rewinds the partition: its 1 s hold
    replaced the brake's, whose end then let the limit be passed without an operator."""
    holds, consumer = Holds(), Calls()
    holds.hold(consumer, A, Hold(40, 10**15, Why.BRAKE, 900))
    holds.hold(consumer, A, Hold(35, 2_000, Why.REFUSED, 1_000))
    assert consumer.made[-1] == ("seek", [("orders", 0, 35)])
    assert holds.release_due(consumer, 3_000) == []
    assert A in holds
    holds.hold(consumer, A, Hold(38, 2_000, Why.REFUSED, 1_000))  # never above the lowest
    assert consumer.made[-1] == ("seek", [("orders", 0, 35)])
    assert holds.release(consumer, [A]) == [A]  # a resume
