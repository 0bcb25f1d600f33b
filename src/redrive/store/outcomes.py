"""What the runtimes write to the store and look up in it: a poll batch's failures, successes and
parked records in one transaction, and the bulk lookups made once per poll batch."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select, update

from redrive.store.keys import key_active, lock_keys, release_keys
from redrive.store.matching import any_key, chunks, each_attempt, each_partition
from redrive.store.rows import Coordinates, Entry, RecordState, Success, encode_headers, key_digest
from redrive.store.schema import ACTIVE, DEAD, IN_FLIGHT, PARKED, PENDING, SUCCEEDED, retries


class Outcomes:
    """One poll batch's outcomes, their rows built before the transaction that writes them
    (on SQLite it holds the database's one write lock from its start)."""

    def __init__(self, entries: Sequence[Entry], successes: Sequence[Success], at: int) -> None:
        self.entries = entries
        self.successes = successes
        self.at = at
        self.parks = [e for e in entries if e.status == PARKED]
        self.failures = [e for e in entries if e.status != PARKED]
        self.failure_rows = [entry_row(e, at) for e in self.failures]

    def write(self, conn: Connection, dialect: str) -> None:
        """Failures first, then successes, then the next parked record of every key whose head
        succeeded or died is released; a parked entry whose key has nothing active by then is
        stored as due at once instead."""
        at, successes = self.at, self.successes
        # Only keys kept in order need the lock (a success carries its key only then).
        lock_keys(conn, dialect, [(e.group, e.topic, e.key) for e in self.entries if e.ordered]
                  + [(s.group, s.topic, s.key) for s in successes])
        if self.failure_rows:
            conn.exec_driver_sql(upsert_sql(dialect), self.failure_rows)
        # A statement per partition and attempt, not one per success: under load each round
        # trip costs milliseconds (250 updates of one row each took 0.9 s).
        by_group: dict[str, list[Success]] = defaultdict(list)
        for success in successes:
            by_group[success.group].append(success)
        for group, done in by_group.items():
            for chunk in chunks(done):
                for records in each_attempt(chunk, dialect):
                    conn.execute(update(retries).where(
                        retries.c.group_id == group, records,
                        retries.c.status.in_((PENDING, IN_FLIGHT))).values(
                            status=SUCCEEDED, updated_ms=at))
        release_keys(conn, [(s.group, s.topic, s.key) for s in successes]
                     + [(e.group, e.topic, e.key) for e in self.failures
                        if e.status == DEAD and e.ordered], at)
        for park in self.parks:
            blocked = key_active(conn, park.group, park.topic, park.key)
            row = entry_row(park, at)
            if not blocked:
                row.update(status=PENDING, due_ms=at)
            conn.exec_driver_sql(upsert_sql(dialect), [row])


# The upsert of a batch's failed records, as its SQL text for the driver's own executemany:
# SQLAlchemy's compiled statement prepared each row's parameters (its bind processing) on the
# path of every failure a store backend records, 58-70 against 52 µs of CPU a row in all for
# 500-row writes on SQLite; the driver takes the rows' dicts as they are. SQLite and PostgreSQL
# share this ON CONFLICT form. entry_row builds exactly these columns.
WRITTEN_COLUMNS = ("group_id", "topic", "partition", "offset", "timestamp_ms", "key",
                   "key_digest", "mode", "value", "headers", "target", "attempt",
                   "first_failure_ms", "due_ms", "status", "reason", "error_type",
                   "error_message", "error_trace", "created_ms", "updated_ms", "dispatches",
                   "notified_ms", "ordered")
_REWRITTEN = ("attempt", "first_failure_ms", "due_ms", "status", "reason", "error_type",
              "error_message", "error_trace", "updated_ms")
_PLACEHOLDERS = {"sqlite": ":{}", "postgresql": "%({})s"}
_RECORD_KEY = ("group_id", "topic", "partition", "offset")


@functools.cache
def upsert_sql(dialect: str) -> str:
    placeholder = _PLACEHOLDERS[dialect]
    table = retries.name
    columns = ", ".join(_quoted(c) for c in WRITTEN_COLUMNS)
    values = ", ".join(placeholder.format(c) for c in WRITTEN_COLUMNS)
    rewrites = ", ".join(f"{_quoted(c)} = excluded.{_quoted(c)}" for c in _REWRITTEN)
    active = ", ".join(f"'{status}'" for status in ACTIVE)
    return (f"INSERT INTO {table} ({columns}) VALUES ({values}) "
            f"ON CONFLICT ({', '.join(_quoted(c) for c in _RECORD_KEY)}) "
            f"DO UPDATE SET {rewrites}, {_quoted('notified_ms')} = NULL "
            # Only forward: a replayed failure, or one reported after a cancel, changes nothing.
            f"WHERE {table}.{_quoted('attempt')} < excluded.{_quoted('attempt')} "
            f"AND {table}.{_quoted('status')} IN ({active})")


def _quoted(column: str) -> str:
    return f'"{column}"'  # "offset" and "partition" are reserved words


def entry_row(entry: Entry, at: int) -> dict[str, Any]:
    return {
        "group_id": entry.group, "topic": entry.topic, "partition": entry.partition,
        "offset": entry.offset, "timestamp_ms": entry.timestamp_ms, "key": entry.key,
        "key_digest": key_digest(entry.key), "mode": entry.mode, "value": entry.value,
        "headers": None if entry.headers is None else encode_headers(entry.headers),
        "target": entry.target, "attempt": entry.attempt,
        "first_failure_ms": entry.first_failure_ms, "due_ms": entry.due_ms,
        "status": entry.status, "reason": entry.reason, "error_type": entry.error_type,
        "error_message": entry.error_message, "error_trace": entry.error_trace,
        "created_ms": at, "updated_ms": at, "dispatches": 0, "notified_ms": None,
        "ordered": entry.ordered,
    }


def record_states(conn: Connection, group: str,
                  wanted: Sequence[Coordinates]) -> dict[Coordinates, RecordState]:
    """Where the rows of these records of one group stand (an absent row is left out), in a
    statement per partition and LOOKUP_CHUNK of them. Only the two columns are read: a runtime
    asks this for every copy it reads back."""
    found: dict[Coordinates, RecordState] = {}
    c = retries.c
    for chunk in chunks(wanted):
        for records in each_partition(chunk, conn.dialect.name):
            for topic, partition, offset, status, attempt in conn.execute(
                    select(c.topic, c.partition, c.offset, c.status, c.attempt)
                    .where(c.group_id == group, records)):
                found[(topic, partition, offset)] = RecordState(status, attempt)
    return found


def active_keys(conn: Connection, group: str,
                digests: Sequence[tuple[str, str | None]]) -> set[tuple[str, str | None]]:
    """Those of these (topic, key digest) of one group with a record waiting, in a statement per
    LOOKUP_CHUNK of them. By digest, as key_active compares: that is what the key index
    holds."""
    c = retries.c
    active: set[tuple[str, str | None]] = set()
    for chunk in chunks(digests):
        active.update((topic, digest) for topic, digest in conn.execute(
            select(c.topic, c.key_digest).distinct().where(
                c.group_id == group, c.status.in_(ACTIVE), any_key(chunk))))
    return active
