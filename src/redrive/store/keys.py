"""Records kept in order by key: whether a key has a record waiting, the release of a key's next
parked record, and on PostgreSQL the advisory locks that keep two writers of one key apart."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, select, text, update

from redrive.store.matching import key_is
from redrive.store.schema import ACTIVE, IN_FLIGHT, PARKED, PENDING, retries


def key_active(conn: Connection, group: str, topic: str, key: bytes | None, *,
               parked: bool = True) -> bool:
    if key is None:
        return False
    statuses = ACTIVE if parked else (PENDING, IN_FLIGHT)
    return conn.execute(select(retries.c.id).where(
        key_is(group, topic, key), retries.c.status.in_(statuses)).limit(1)).first() is not None


def release_keys(conn: Connection, keys: Iterable[tuple[str, str, bytes | None]],
                 at: int) -> int:
    released = 0
    for group, topic, key in {k for k in keys if k[2] is not None}:
        if key_active(conn, group, topic, key, parked=False):
            continue
        head = conn.execute(select(retries.c.id).where(
            key_is(group, topic, key), retries.c.status == PARKED)
            .order_by(retries.c.partition, retries.c.offset).limit(1)).scalar()
        if head is not None:
            conn.execute(update(retries).where(retries.c.id == head).values(
                status=PENDING, due_ms=at, updated_ms=at))
            released += 1
    return released


def ordered_keys(conn: Connection, chosen: ColumnElement[bool]
                 ) -> list[tuple[str, str, bytes | None]]:
    """The keys kept in order among the rows `chosen`, to lock before those rows change."""
    c = retries.c
    return [(g, t, k) for g, t, k in conn.execute(
        select(c.group_id, c.topic, c.key).where(chosen, c.ordered, c.key.is_not(None))
        .distinct()).all()]


def held_back(conn: Connection, made_pending: Sequence[Any]) -> list[int]:
    """Of the rows of keys kept in order just made pending (id, group_id, topic, key,
    partition, offset), those that must wait instead: all but each key's first (by partition
    and offset), and all of a key that had another row pending or in flight already. They are
    parked and released one by one."""
    by_key: dict[tuple[str, str, bytes], list[Any]] = defaultdict(list)
    for row in made_pending:
        by_key[(row.group_id, row.topic, row.key)].append(row)
    held: list[int] = []
    for (group, topic, key), of_key in by_key.items():
        of_key.sort(key=lambda row: (row.partition, row.offset))
        ids = [row.id for row in of_key]
        active = conn.execute(select(func.count()).select_from(retries).where(
            key_is(group, topic, key), retries.c.status.in_((PENDING, IN_FLIGHT)))).scalar_one()
        held += ids if active > len(ids) else ids[1:]
    return held


def lock_keys(conn: Connection, dialect: str,
              keys: Iterable[tuple[str, str, bytes | None]]) -> None:
    if dialect != "postgresql":
        return  # SQLite transactions already run one at a time
    # A 64-bit lock id per (group, topic, key); sorted, so two writers never wait on
    # each other crosswise: unnest yields them in the array's order, one statement for all.
    ids = sorted({_lock_id(g, t, k) for g, t, k in keys if k is not None})
    if ids:
        conn.execute(text("SELECT pg_advisory_xact_lock(lock) "
                          "FROM unnest(CAST(:locks AS bigint[])) AS lock"), {"locks": ids})


def _lock_id(group: str, topic: str, key: bytes) -> int:
    digest = hashlib.sha1(b"\0".join((group.encode(), topic.encode(), key)),
                          usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
