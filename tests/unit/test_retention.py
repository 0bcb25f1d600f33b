"""The start-time judgement of a topic's retention against the longest a record waits there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from redrive import kafka, retention
from redrive.retention import RetentionTooShort


def described(found: dict[str, int]) -> Any:
    def retentions(admin: Any, topics: Sequence[str], timeout_s: float = 10.0) -> dict[str, int]:
        assert admin == "admin"
        return {topic: found[topic] for topic in topics if topic in found}
    return retentions


@pytest.mark.parametrize(("kept_ms", "refused"), [
    (-1, False),  # kept for ever
    (300_001, False),
    (300_000, True),  # deleted as it falls due
    (1_000, True),
    (0, True),
])
def test_a_topic_is_refused_when_it_keeps_records_no_longer_than_they_wait(
        monkeypatch: pytest.MonkeyPatch, kept_ms: int, refused: bool) -> None:
    monkeypatch.setattr(kafka, "retentions", described({"t.g.retry.5m": kept_ms}))
    if not refused:
        retention.check("admin", {"t.g.retry.5m": 300_000})  # type: ignore[arg-type]
        return
    with pytest.raises(RetentionTooShort) as raised:
        retention.check("admin", {"t.g.retry.5m": 300_000})  # type: ignore[arg-type]
    assert (raised.value.topic, raised.value.retention_ms, raised.value.wait_ms) == (
        "t.g.retry.5m", kept_ms, 300_000)
    assert "no longer than the 5m a record waits there" in str(raised.value)


def test_topics_the_cluster_does_not_describe_are_not_judged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "retentions", described({"b": 10}))
    with pytest.raises(RetentionTooShort, match=r"'b' has retention\.ms=10 "):
        retention.check("admin", {"a": 60_000, "b": 60_000})  # type: ignore[arg-type]
    retention.check("admin", {"a": 60_000})  # type: ignore[arg-type]
