"""Notifications of dead records against a real store (SQLite and PostgreSQL): claims that ran
out and were taken over."""

from __future__ import annotations

from sqlalchemy import select

from redrive.clock import now_ms
from redrive.store import RetryStore, claims
from redrive.store.schema import DEAD, retries

from .conftest import entry

CLAIM_MS = 60_000


def dead_rows(store: RetryStore, group: str, count: int) -> None:
    store.write([entry(group, "t", o, status=DEAD, reason="exhausted") for o in range(count)], [])


def notified_marks(store: RetryStore) -> dict[int, int | None]:
    with store.engine.connect() as conn:
        return dict(conn.execute(select(retries.c.offset, retries.c.notified_ms)).all())


def test_a_stalled_notifier_leaves_the_claim_that_took_over_its_rows(store: RetryStore) -> None:
    dead_rows(store, "stalled", 3)
    at = now_ms()
    with store.engine.begin() as conn:
        stalled = claims.take_unnotified(conn, 10, at)
    # Its first hook hangs past the claim: another scheduler hands the claim back and claims the
    # rows again.
    assert store.release_notification_claims(CLAIM_MS, at_ms=at + CLAIM_MS + 1) == 3
    with store.engine.begin() as conn:
        taker = claims.take_unnotified(conn, 10, at + CLAIM_MS + 1)
    assert [row.offset for row in taker.rows] == [0, 1, 2]

    # The stalled one wakes up: one row notified, the others to hand back. Neither may touch
    # the live claim, or a third scheduler would notify the rows while the taker does.
    stalled.notified(stalled.rows[0].id)
    with store.engine.begin() as conn:
        claims.mark_notified(conn, stalled, at + CLAIM_MS + 2)
    assert set(notified_marks(store).values()) == {-(at + CLAIM_MS + 1)}
    with store.engine.begin() as conn:
        assert claims.take_unnotified(conn, 10, at + CLAIM_MS + 3).rows == []

    for row in taker.rows:
        taker.notified(row.id)
    with store.engine.begin() as conn:
        claims.mark_notified(conn, taker, at + CLAIM_MS + 4)
    assert set(notified_marks(store).values()) == {at + CLAIM_MS + 4}
