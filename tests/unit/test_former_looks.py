"""Runtimes look for former topics with records as they run: a broker that does not answer
costs one short wait per LOOK_EVERY_S, never one per poll."""

from __future__ import annotations

import gc
import logging
import time
import weakref

import pytest

from redrive import former_looks
from redrive.former_looks import FormerLooks


def test_a_look_runs_once_each_period_through_one_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 0.0)
    looks = FormerLooks("127.0.0.1:1", "group g")
    seen: list[dict[str, int]] = []
    clients: list[object] = []
    monkeypatch.setattr(former_looks.kafka, "admin",
                        lambda connection: clients.append(connection) or len(clients))
    monkeypatch.setattr(former_looks.kafka, "topic_partitions",
                        lambda admin, timeout_s: {"t": admin})
    looks.again(seen.append)
    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 3600.0)
    looks.again(seen.append)  # due since the first, which ran with a period of 0
    looks.again(seen.append)
    assert seen == [{"t": 1}, {"t": 1}]
    assert clients == ["127.0.0.1:1"]


def test_a_look_the_broker_does_not_answer_waits_for_the_next_one(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 0.0)
    monkeypatch.setattr(former_looks, "LOOK_TIMEOUT_S", 0.3)
    looks = FormerLooks("127.0.0.1:1", "group g")
    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 3600.0)
    seen: list[dict[str, int]] = []
    with caplog.at_level(logging.INFO, logger="redrive.former_looks"):
        looks.again(seen.append)
        started = time.monotonic()
        for _ in range(100):
            looks.again(seen.append)
    assert time.monotonic() - started < 0.1
    assert seen == []
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("group g: looking for former topics with records: ")
    assert "127.0.0.1:1" in message and message.endswith("again in 3600 s")


def test_a_closed_look_lets_its_client_go(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client:
        pass

    made: list[weakref.ref[Client]] = []

    def admin(connection: object) -> Client:
        client = Client()
        made.append(weakref.ref(client))
        return client

    monkeypatch.setattr(former_looks, "LOOK_EVERY_S", 0.0)
    monkeypatch.setattr(former_looks.kafka, "admin", admin)
    monkeypatch.setattr(former_looks.kafka, "topic_partitions", lambda admin, timeout_s: {})
    looks = FormerLooks("127.0.0.1:1", "group g")
    looks.again(lambda partitions: None)
    gc.collect()
    assert made[0]() is not None  # kept between looks
    looks.close()
    gc.collect()
    assert made[0]() is None
