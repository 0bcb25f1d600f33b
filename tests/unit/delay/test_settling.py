"""Settling an at-least-once forward record by record: what is committed, what is read again,
and which records read again are not forwarded again."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from redrive.delay.settling import Landed, settle
from redrive.errors import DeliveryFailed

A, B = ("tier", 0), ("tier", 1)
REFUSED = DeliveryFailed("orders", 0, "Broker: Message size too large")


def test_a_partition_commits_up_to_its_first_refused_record_and_remembers_what_landed_past_it(
        ) -> None:
    origins = [(A, 10), (A, 11), (A, 12), (B, 5), (A, 13)]
    outcomes = [None, REFUSED, None, None, REFUSED]
    settlement = settle(origins, outcomes, [TopicPartition(*A, 14), TopicPartition(*B, 6)])
    assert [(tp.topic, tp.partition, tp.offset) for tp in settlement.commits] == [
        (*A, 11), (*B, 6)]
    assert settlement.refused == {A: 11}
    assert settlement.why is REFUSED
    assert settlement.landed == [0, 2, 3]
    landed = Landed()
    landed.note(settlement, origins)
    assert landed.of(A) == {12}  # 10 is below the commit, 13 was refused
    assert landed.of(B) is None
    landed.committed([TopicPartition(*A, 12)])
    assert landed.of(A) == {12}
    landed.committed([TopicPartition(*A, 13)])
    assert landed.of(A) is None and not landed


def test_a_revoked_partition_forgets_what_landed() -> None:
    origins = [(A, 1), (A, 2)]
    landed = Landed()
    landed.note(settle(origins, [REFUSED, None], [TopicPartition(*A, 3)]), origins)
    assert landed.of(A) == {2}
    landed.drop([A])
    assert landed.of(A) is None


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.booleans()), max_size=30))
def test_nothing_refused_or_below_a_refusal_is_committed_past_and_nothing_forwarded_is_lost(
        copies: list[tuple[tuple[str, int], bool]]) -> None:
    next_offset = {A: 0, B: 0}
    origins = []
    for key, _ in copies:
        origins.append((key, next_offset[key]))
        next_offset[key] += 1
    outcomes = [REFUSED if refused else None for _, refused in copies]
    ends = [TopicPartition(*key, end) for key, end in next_offset.items() if end]
    settlement = settle(origins, outcomes, ends)
    landed = Landed()
    landed.note(settlement, origins)
    commits = {(tp.topic, tp.partition): tp.offset for tp in settlement.commits}
    for (key, offset), outcome in zip(origins, outcomes, strict=True):
        if outcome is not None:
            assert commits[key] <= offset  # read again
        elif offset >= commits[key]:
            assert offset in (landed.of(key) or set())  # read again, not forwarded again
        else:
            assert offset not in (landed.of(key) or set())
