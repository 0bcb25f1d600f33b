"""Fixtures for the retry-store tests: a PostgreSQL server for the session, a fresh store per test
on SQLite and on PostgreSQL, and helpers to run consumers and schedulers in threads.

The PostgreSQL server is started (initdb + postgres, fsync off) only if a test asks for it.
REDRIVE_TEST_POSTGRES_URL=postgresql://user@host/db uses that server instead; each test then
creates its own database there, so the user needs CREATEDB.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest

from redrive.record import Record
from redrive.store import RetryStore, Scheduler
from redrive.store.devpostgres import DevPostgres
from redrive.store.schema import PENDING
from redrive.store.store import Entry, now_ms

POSTGRES_ENV = "REDRIVE_TEST_POSTGRES_URL"
DATABASES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class ExternalPostgres:
    url: str

    def create_database(self) -> str:
        name = f"redrive_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        base, _, _ = self.url.rpartition("/")
        return f"{base}/{name}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[DevPostgres | ExternalPostgres]:
    external = os.environ.get(POSTGRES_ENV)
    if external:
        yield ExternalPostgres(external)
        return
    server = DevPostgres(durable=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=DATABASES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new empty store's URL: a SQLite file, then a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    server: DevPostgres | ExternalPostgres = request.getfixturevalue("postgres")
    return server.create_database()


@pytest.fixture
def store(store_url: str) -> Iterator[RetryStore]:
    opened = RetryStore(store_url)
    try:
        yield opened
    finally:
        opened.close()


def entry(group: str, topic: str, offset: int, *, partition: int = 0, key: bytes | None = None,
          value: bytes | None = b"v", status: str = PENDING, attempt: int = 1,
          due_ms: int | None = None, mode: str = "payload", error_type: str = "app.Boom",
          reason: str | None = None, ordered: bool = False) -> Entry:
    return Entry(group=group, topic=topic, partition=partition, offset=offset,
                 timestamp_ms=1_700_000_000_000, key=key, mode=mode,
                 value=value if mode == "payload" else None,
                 headers=[("trace-id", b"t-%d" % offset)] if mode == "payload" else None,
                 target=None, attempt=attempt, first_failure_ms=now_ms(),
                 due_ms=now_ms() if due_ms is None else due_ms, status=status, reason=reason,
                 error_type=error_type, error_message="boom", error_trace="Traceback...",
                 ordered=ordered)


class Runnable(Protocol):
    def run(self) -> None: ...

    def stop(self) -> None: ...


class Background:
    """run() of a consumer or scheduler in a thread; stop() joins it and re-raises its error."""

    def __init__(self, runner: Runnable) -> None:
        self.runner = runner
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
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


@pytest.fixture
def background() -> Iterator[Callable[[Runnable], Background]]:
    started: list[Background] = []

    def start(runner: Runnable) -> Background:
        run = Background(runner)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.thread.is_alive():
            run.runner.stop()
            run.thread.join(30)


@dataclass
class Calls:
    """Handler calls, each with its local start time, in order."""

    seen: list[tuple[Record, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: Record) -> None:
        with self.lock:
            self.seen.append((record, now_ms()))

    def count(self, value: bytes) -> int:
        with self.lock:
            return sum(1 for record, _ in self.seen if record.value == value)

    def records(self) -> list[tuple[Record, int]]:
        with self.lock:
            return list(self.seen)


def scheduler(store: RetryStore, bootstrap: str, **kwargs: Any) -> Scheduler:
    return Scheduler(store, bootstrap, idle_s=0.02, **kwargs)
