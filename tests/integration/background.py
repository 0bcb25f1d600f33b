"""Long-running parts (consumers, schedulers) run in a thread for the length of a test."""

from __future__ import annotations

import threading
from typing import Protocol

from redrive.consumer import RetryingConsumer


class Runnable(Protocol):
    def run(self) -> None: ...

    def stop(self) -> None: ...


class Background:
    """run() in a daemon thread; stop() joins it and re-raises whatever run() raised."""

    def __init__(self, runner: Runnable) -> None:
        self.runner = runner
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"background-{runner!r}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout_s: float = 30.0) -> None:
        self.runner.stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"{self.runner!r} did not stop"
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        """At the end of a test that failed before stopping it: stop without re-raising."""
        if self.thread.is_alive():
            self.runner.stop()
            self.thread.join(30)


class Running(Background):
    """A RetryingConsumer in the background, subscribed before its thread starts."""

    def __init__(self, consumer: RetryingConsumer) -> None:
        self.consumer = consumer
        consumer.start()
        super().__init__(consumer)

    def total(self, name: str) -> float:
        return self.consumer.metrics.total(name)
