"""The start-time judgement of a topic where records wait: its retention against the longest a
record waits there, and its cleanup policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from redrive import kafka, retention
from redrive.kafka.admin import Keeping
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
