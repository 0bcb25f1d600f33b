"""The console answers a failed read of the cluster with 503 naming it, on every page and call,
whichever of redrive's errors the read raised, and never a 500."""

from __future__ import annotations

import html
from typing import Any

import pytest
from fastapi.testclient import TestClient

from redrive.errors import InvalidArgument
from redrive.kafka.ranges import RangeReadFailed
from redrive.ops.console import Console
from redrive.ops.replay import ReplayFailed
from redrive.ops.web import create_app


@pytest.mark.parametrize(("error", "status"), [
    (RangeReadFailed("x.g.dlt", 0, 0, 10, "stuck at offset 3 for 5s"), 503),
    (ReplayFailed("could not read redrive.replays to its end"), 503),
    (InvalidArgument("since", "soon", "expected a duration"), 400),
])
@pytest.mark.parametrize("path", ["/dead-letters/x.g.dlt", "/api/dead-letters/x.g.dlt"])
def test_a_read_that_fails_is_answered_naming_it(monkeypatch: pytest.MonkeyPatch, path: str,
                                                  error: Exception, status: int) -> None:
    def failing(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(Console, "view", failing)
    answer = TestClient(create_app("127.0.0.1:1", timeout_s=1.0)).get(path)
    assert answer.status_code == status
    assert str(error) in (answer.text if path.startswith("/api/") else html.unescape(answer.text))
