"""The start-time judgement of a topic where records wait: its retention against the longest a
record waits there, and its cleanup policy."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from redrive import kafka, retention
from redrive.kafka.admin import Keeping
from redrive.metrics import Metrics
from redrive.retention import CompactedTopic, RetentionTooShort


def described(found: dict[str, Keeping]) -> Any:
    def keeping(admin: Any, topics: Sequence[str], timeout_s: float = 10.0) -> dict[str, Keeping]:
        assert admin == "admin"
        return {topic: found[topic] for topic in topics if topic in found}
    return keeping


@pytest.mark.parametrize(("kept_ms", "refused"), [
    (-1, False),  # kept for ever
    (300_001, False),
    (300_000, True),  # deleted as it falls due
    (1_000, True),
    (0, True),
])
def test_a_topic_is_refused_when_it_keeps_records_no_longer_than_they_wait(
        monkeypatch: pytest.MonkeyPatch, kept_ms: int, refused: bool) -> None:
    monkeypatch.setattr(kafka, "keeping", described({"t.g.retry.5m": Keeping(kept_ms, True,
                                                                              False)}))
    if not refused:
        retention.check("admin", {"t.g.retry.5m": 300_000})  # type: ignore[arg-type]
        return
    with pytest.raises(RetentionTooShort) as raised:
        retention.check("admin", {"t.g.retry.5m": 300_000})  # type: ignore[arg-type]
    assert (raised.value.topic, raised.value.retention_ms, raised.value.wait_ms) == (
        "t.g.retry.5m", kept_ms, 300_000)
    assert "no longer than the 5m a record waits there" in str(raised.value)


def test_a_compacting_topic_is_refused_whatever_its_retention(
        monkeypatch: pytest.MonkeyPatch) -> None:
    topics = {"compact": Keeping(1_000, False, True), "both": Keeping(-1, True, True),
              "kept": Keeping(1_000, False, False)}  # neither deletes nor compacts
    monkeypatch.setattr(kafka, "keeping", described(topics))
    for name in ("compact", "both"):
        with pytest.raises(CompactedTopic, match=f"'{name}' has cleanup.policy=compact") as raised:
            retention.check("admin", {name: 60_000})  # type: ignore[arg-type]
        assert raised.value.topic == name
    retention.check("admin", {"kept": 60_000})  # type: ignore[arg-type]


def test_topics_the_cluster_does_not_describe_are_not_judged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "keeping", described({"b": Keeping(10, True, False)}))
    with pytest.raises(RetentionTooShort, match=r"'b' has retention\.ms=10 "):
        retention.check("admin", {"a": 60_000, "b": 60_000})  # type: ignore[arg-type]
    retention.check("admin", {"a": 60_000})  # type: ignore[arg-type]


class FakeGroupConsumer:
    """Committed offsets and watermarks of a few partitions, as a group's consumer reports them."""

    def __init__(self, committed: dict[tuple[str, int], int], lows: dict[tuple[str, int], int],
                 down: bool = False, refuse_commits: bool = False) -> None:
        self._committed, self._lows, self._down = committed, lows, down
        self._refuse_commits = refuse_commits
        self.commits: list[dict[tuple[str, int], int]] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert not asynchronous  # the runtimes count their own asynchronous commits' answers
        if self._refuse_commits:
            raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS, "rebalancing"))
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self._down:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
        return [TopicPartition(tp.topic, tp.partition,
                               self._committed.get((tp.topic, tp.partition), -1001))
                for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self._lows[(tp.topic, tp.partition)], 100


def test_offsets_deleted_past_what_the_group_committed_are_logged_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    lows = {("r", 0): 10, ("r", 1): 10, ("r", 2): 10, ("r", 3): 0}
    # Committed before the deleted ones, at them, past them; never committed (from 0).
    committed = {("r", 0): 4, ("r", 1): 10, ("r", 2): 12}
    metrics = Metrics("consumer", "g")
    group = FakeGroupConsumer(committed, lows | {("r", 4): 7})
    with caplog.at_level(logging.ERROR, logger="redrive.retention"):
        gone = retention.report_gone(group, [*lows, ("r", 4)], metrics,  # type: ignore[arg-type]
                                     "group g")
    assert gone == {("r", 0): 6, ("r", 4): 7}
    # Committed past, so that the next assignment does not tell the same loss again.
    assert group.commits == [{("r", 0): 10, ("r", 4): 7}]
    assert metrics.value("redrive_lost_offsets_total", topic="r") == 13
    assert [message.split(", which")[0] for message in caplog.messages] == [
        "group g: r[0] no longer holds offsets 4 to 9",
        "group g: r[4] no longer holds offsets 0 to 6"]
    # Where it committed, the loss is certain; where it committed nothing, an expired commit
    # would look the same, and the line says so.
    assert ["offsets.retention.minutes" in message for message in caplog.messages] == [
        False, True]


def test_a_broker_that_does_not_answer_leaves_the_check_undone_without_raising(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics("consumer", "g")
    with caplog.at_level(logging.WARNING, logger="redrive.retention"):
        gone = retention.report_gone(FakeGroupConsumer({}, {}, down=True), [("r", 0)], metrics,
                                     "group g")  # type: ignore[arg-type]
    assert gone == {}
    assert metrics.total("redrive_lost_offsets_total") == 0
    assert caplog.messages == ["group g: could not check 1 partition(s) for records deleted "
                               "before they were read: KafkaError{code=_TIMED_OUT,val=-185,"
                               "str=\"timed out\"}"]


def test_a_commit_past_the_gap_that_fails_is_logged_and_the_loss_still_told(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics("consumer", "g")
    group = FakeGroupConsumer({}, {("r", 0): 5}, refuse_commits=True)
    with caplog.at_level(logging.WARNING, logger="redrive.retention"):
        gone = retention.report_gone(group, [("r", 0)], metrics, "group g")  # type: ignore[arg-type]
    assert gone == {("r", 0): 5} and metrics.total("redrive_lost_offsets_total") == 5
    assert caplog.messages[-1].startswith("group g: could not commit past the deleted offsets")
