"""Fixtures shared by the integration tests of every runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from redrive.consumer import RetryingConsumer

from .background import Background, Runnable, Running

Run = TypeVar("Run", bound=Background)


def _stopped_at_end(kind: Callable[[Any], Run]) -> Iterator[Callable[[Any], Run]]:
    """A starter of background runs, each stopped at the end of the test whatever happens."""
    started: list[Run] = []

    def start(runner: Any) -> Run:
        run = kind(runner)
        started.append(run)
        return run

    yield start
    for run in started:
        run.abandon()
    # A run the test did not stop itself must not fail unseen.
    errors = [run.error for run in started if run.error is not None]
    assert not errors, errors


@pytest.fixture
def background() -> Iterator[Callable[[Runnable], Background]]:
    yield from _stopped_at_end(Background)


@pytest.fixture
def running() -> Iterator[Callable[[RetryingConsumer], Running]]:
    yield from _stopped_at_end(Running)
