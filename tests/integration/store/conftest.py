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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from redrive.clock import now_ms
from redrive.dev.postgres import DevPostgres
from redrive.record import Record
from redrive.store import RetryStore, Scheduler
from redrive.store.rows import Entry
from redrive.store.schema import PENDING

from ..background import Background, Runnable

__all__ = ["Background", "Runnable"]

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


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each transaction the stores open from here on, as whether it writes."""
    opened: list[bool] = []
    begin = RetryStore._begin

    def counted(self: RetryStore, *, read_only: bool = False) -> Any:
        opened.append(not read_only)
        return begin(self, read_only=read_only)

    monkeypatch.setattr(RetryStore, "_begin", counted)
    return opened
