"""The delay service runs each poll's work with the garbage collector held off (it runs no user
code, and the collector's passes over a batch's records found nothing), and gives it back between
polls and once it stops."""

from __future__ import annotations

import gc

import pytest

from redrive.delay import DelayService


def test_each_step_runs_without_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    service = DelayService("127.0.0.1:1")
    seen: list[bool] = []
    between: list[bool] = []

    def step() -> None:
        seen.append(gc.isenabled())

    def stopping() -> bool:
        between.append(gc.isenabled())
        return len(seen) >= 3

    monkeypatch.setattr(service, "_start", lambda: None)
    monkeypatch.setattr(service, "_close", lambda: None)
    monkeypatch.setattr(service, "_step", step)
    monkeypatch.setattr(service._stopping, "is_set", stopping)
    service.run()
    assert seen == [False, False, False]
    assert between and all(between) and gc.isenabled()
