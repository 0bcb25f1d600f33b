"""The delay service looks for former tiers with records as it runs: a broker that does not
answer costs one short wait per FORMER_RECHECK_S, never one per poll."""

from __future__ import annotations

import logging
import time

import pytest

from redrive.delay import Tiers, own_topics
from redrive.delay.own_topics import FormerTiers


def test_a_look_the_broker_does_not_answer_waits_for_the_next_one(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(own_topics, "FORMER_RECHECK_S", 0.0)
    monkeypatch.setattr(own_topics, "RECHECK_TIMEOUT_S", 0.3)
    former = FormerTiers("127.0.0.1:1", Tiers.of(("1s",), prefix="p.delay"), "g")
    monkeypatch.setattr(own_topics, "FORMER_RECHECK_S", 3600.0)
    with caplog.at_level(logging.INFO, logger="redrive.delay"):
        assert former.look_again() is False
        started = time.monotonic()
        assert [former.look_again() for _ in range(100)] == [False] * 100
    assert time.monotonic() - started < 0.1
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("looking for former tiers with records: ")
    assert "127.0.0.1:1" in message and message.endswith("again in 3600 s")
    assert former.found == {}
