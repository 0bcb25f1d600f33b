"""Fixtures shared by the integration tests of every runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from redrive.consumer import RetryingConsumer
from redrive.dev.brokers import DevBroker

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


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    """A noida-db of the module's own, which its tests may stop or kill: the session's broker
    serves the other tests."""
    broker = DevBroker("noida-db", data_dir=tmp_path_factory.mktemp("module-broker"))
    broker.start(timeout_s=60)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def own_broker(module_broker: DevBroker) -> DevBroker:
    """The module's broker, running (a test that failed mid-outage may have left it down)."""
    if not module_broker.running:
        module_broker.start(timeout_s=60)
    return module_broker
