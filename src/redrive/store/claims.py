"""What the schedulers take from the store: due rows claimed before they are published and
settled after, claims and leases that ran out, dead rows to notify, and parked records left
without a head."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from sqlalchemy import Connection, Row, and_, or_, select, update

from redrive.store.keys import lock_keys, release_keys
from redrive.store.matching import one_of
from redrive.store.rows import CorruptRow, StoredRetry, row_positions
from redrive.store.schema import DEAD, IN_FLIGHT, PARKED, PENDING, SUCCEEDED, retries


@dataclass
class DueBatch:
    """Due rows claimed by one scheduler: in flight, not yet dispatched (`dispatched_ms` None).

    The claim is committed before the caller publishes, so the database's locks are not held
    while the broker acknowledges. What the caller marks is written when its block ends, or,
    deferred, by the caller later (see `defer`).
    """

    rows: list[StoredRetry]
    # When the rows were claimed, their `updated_ms`: the claim's token. A claimer that stalled
    # past `claim_ms` may find its rows reclaimed and claimed again by another scheduler; its
    # marks then change nothing (a claim is always at least `claim_ms` later than the one it
    # takes over, so the two never share a time).
    claimed_ms: int
    # Claimed rows whose headers cannot be read: the claimer marks them dead.
    corrupt: list[CorruptRow] = field(default_factory=list)
    dispatched: list[int] = field(default_factory=list)
    dispatched_ms: int = 0
    dead: list[tuple[list[StoredRetry], str, str, int]] = field(default_factory=list)
    held: list[tuple[int, int]] = field(default_factory=list)  # (id, due again at, epoch ms)
    deferred: bool = False

    def defer(self) -> None:
        """Leave the marks to the caller: it passes the batch to the next claim
        (`RetryStore.take_due(settling=...)`), which writes them in its own transaction, or to
        `RetryStore.settle`. Until then the rows stay claimed, as if the caller had died."""
        self.deferred = True

    def mark_in_flight(self, ids: Iterable[int], at_ms: int) -> None:
        self.dispatched.extend(ids)
        self.dispatched_ms = at_ms

    def mark_dead(self, rows: Sequence[StoredRetry], reason: str, why: str, at_ms: int) -> None:
        if rows:
            self.dead.append((list(rows), reason, why, at_ms))

    def mark_held(self, retry_id: int, due_ms: int) -> None:
        """Pending again, due at `due_ms`: its copy was refused, and would be at once again."""
        self.held.append((retry_id, due_ms))

    @property
    def taken(self) -> int:
        return len(self.rows) + len(self.corrupt)

    @property
    def dead_ids(self) -> set[int]:
        return {row.id for rows, *_ in self.dead for row in rows}

    @property
    def unsettled(self) -> list[int]:
        settled = set(self.dispatched).union(self.dead_ids)
        settled.update(retry_id for retry_id, _ in self.held)
        return [row.id for row in [*self.rows, *(c.row for c in self.corrupt)]
                if row.id not in settled]


@dataclass
class Unnotified:
    rows: list[StoredRetry]
    # When the rows were claimed: their notified_ms is minus this while the claim is theirs. A
    # notifier that stalled past the claim time may find its rows handed back and claimed by
    # another scheduler; its marks then change nothing (the two claims never share a time,
    # see DueBatch.claimed_ms). An empty batch claimed nothing.
    claimed_ms: int = 0
    done: list[int] = field(default_factory=list)

    def notified(self, retry_id: int) -> None:
        self.done.append(retry_id)


def due_batch(taken: Iterable[Row[tuple[object, ...]]], claimed_ms: int) -> DueBatch:
    rows, corrupt = [], []
    for row in taken:
        try:
            rows.append(StoredRetry.of(row))
        except CorruptRow as exc:
            corrupt.append(exc)
    return DueBatch(rows, claimed_ms, corrupt)


def claim_due(conn: Connection, limit: int, at: int) -> list[Row[tuple[object, ...]]]:
    """Up to `limit` due pending rows, now claimed (in flight, not dispatched), earliest due
    first. FOR UPDATE SKIP LOCKED lets schedulers on PostgreSQL share them; on SQLite they take
    turns. One statement: the claim was a select and an update, two round trips a pass."""
    c = retries.c
    due = (select(c.id).where(c.status == PENDING, c.due_ms <= at).order_by(c.due_ms)
           .limit(limit).with_for_update(skip_locked=True).scalar_subquery())
    taken = conn.execute(update(retries).where(c.id.in_(due))
                         .values(status=IN_FLIGHT, dispatched_ms=None, updated_ms=at)
                         .returning(*c)).all()
    # RETURNING gives no order.
    return sorted(taken, key=_DUE_ORDER)


_DUE_ORDER = itemgetter(*row_positions("due_ms", "id"))


def settle(conn: Connection, batch: DueBatch) -> None:
    """Write what the claimer marked, and hand back the rows it did not, of those still under
    its claim."""
    c, dialect = retries.c, conn.dialect.name
    claimed = and_(c.status == IN_FLIGHT, c.dispatched_ms.is_(None),
                   c.updated_ms == batch.claimed_ms)
    if batch.dead:
        # Before any row changes, as a consumer's outcomes take them: otherwise a record the
        # consumer parks meanwhile sees its head still in flight, and the release below does not
        # see it yet, so it stays parked until the orphan sweep.
        lock_keys(conn, dialect, [(r.group, r.topic, r.key)
                                  for rows, *_ in batch.dead for r in rows])
    if batch.dispatched:
        # A copy may already have been handled: a row that succeeded or died keeps that and
        # only learns when it was dispatched; one that failed again waits, pending, for its
        # next claim, which is left to mark it.
        conn.execute(update(retries).where(
            one_of(c.id, batch.dispatched, dialect),
            or_(claimed, and_(c.dispatched_ms.is_(None), c.status.in_((SUCCEEDED, DEAD)))))
            .values(dispatched_ms=batch.dispatched_ms, dispatches=c.dispatches + 1))
    for rows, reason, why, at in batch.dead:
        conn.execute(update(retries).where(
            one_of(c.id, [r.id for r in rows], dialect), claimed).values(
                status=DEAD, reason=reason, error_type="redrive.store." + reason,
                error_message=why, updated_ms=at))
        release_keys(conn, [(r.group, r.topic, r.key) for r in rows], at)
    for retry_id, due_ms in batch.held:
        conn.execute(update(retries).where(c.id == retry_id, claimed).values(
            status=PENDING, due_ms=due_ms))
    if batch.unsettled:
        # Back to pending, unless a copy of theirs was handled meanwhile.
        conn.execute(update(retries).where(one_of(c.id, batch.unsettled, dialect), claimed)
                     .values(status=PENDING))


def reclaim_expired(conn: Connection, lease_ms: int, claim_ms: int, at: int) -> int:
    """In-flight rows dispatched `lease_ms` ago or claimed `claim_ms` ago, pending again."""
    c = retries.c
    result = conn.execute(update(retries).where(
        c.status == IN_FLIGHT,
        or_(c.dispatched_ms <= at - lease_ms,
            and_(c.dispatched_ms.is_(None), c.updated_ms <= at - claim_ms)))
        .values(status=PENDING, updated_ms=at))
    return int(result.rowcount)


# A dead row's notified_ms: None until notified, then when it was; claimed by a scheduler that
# is notifying it, minus the time of the claim.


def any_unnotified(conn: Connection) -> bool:
    """Whether a dead row waits for its notification (read only: asked every pass)."""
    c = retries.c
    return conn.execute(select(c.id).where(c.status == DEAD, c.notified_ms.is_(None))
                        .limit(1)).first() is not None


def take_unnotified(conn: Connection, limit: int, at: int) -> Unnotified:
    """Claim up to `limit` dead rows not notified yet (skipping other schedulers' claims)."""
    c = retries.c
    due = (select(c.id).where(c.status == DEAD, c.notified_ms.is_(None)).order_by(c.id)
           .limit(limit).with_for_update(skip_locked=True).scalar_subquery())
    taken = conn.execute(update(retries).where(c.id.in_(due)).values(notified_ms=-at)
                         .returning(*c)).all()
    return Unnotified(sorted((StoredRetry.shown(r) for r in taken), key=lambda row: row.id), at)


def mark_notified(conn: Connection, batch: Unnotified, at: int) -> None:
    """The notified rows marked, the others handed back, of those still under the batch's
    claim."""
    c, dialect = retries.c, conn.dialect.name
    claimed = c.notified_ms == -batch.claimed_ms
    if batch.done:
        conn.execute(update(retries).where(one_of(c.id, batch.done, dialect), claimed)
                     .values(notified_ms=at))
    done = set(batch.done)
    left = [row.id for row in batch.rows if row.id not in done]
    if left:
        conn.execute(update(retries).where(one_of(c.id, left, dialect), claimed)
                     .values(notified_ms=None))


def release_notification_claims(conn: Connection, claim_ms: int, at: int) -> int:
    """Dead rows claimed for notification at least `claim_ms` ago (their scheduler died while
    notifying), to be notified again."""
    c = retries.c
    result = conn.execute(update(retries).where(
        c.status == DEAD, c.notified_ms < 0, c.notified_ms >= claim_ms - at)
        .values(notified_ms=None))
    return int(result.rowcount)


def release_orphans(conn: Connection, at: int) -> int:
    heads = conn.execute(select(retries.c.group_id, retries.c.topic, retries.c.key)
                         .where(retries.c.status == PARKED)
                         .group_by(retries.c.group_id, retries.c.topic,
                                   retries.c.key_digest, retries.c.key)).all()
    return release_keys(conn, [(g, t, k) for g, t, k in heads], at)
