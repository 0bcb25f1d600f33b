"""RetryStore: failed records (or their coordinates) kept in a database until they are due.

SQLite by default (a file path), PostgreSQL by URL. One row per record and group, keyed by the
record's original topic/partition/offset, so that writing the same failure twice (a consumer
replaying a batch after a crash) changes nothing: a row moves forward only to a higher attempt.

On SQLite every transaction starts with BEGIN IMMEDIATE: writers queue on the database lock
instead of failing when a read lock would have to be upgraded, and two schedulers take turns.
On PostgreSQL, due rows are taken with FOR UPDATE SKIP LOCKED so schedulers share them, and
transactions that park or release records of a key hold an advisory lock on that key.

RetryStore owns the connections and the transactions; the statements of each concern live
beside it: `outcomes` (what the runtimes write and look up), `claims` (what the schedulers take),
`keys` (records kept in order by key) and `matching` (the conditions that pick rows).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, delete, func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError
from redrive.store import claims, outcomes, schema
from redrive.store.claims import DueBatch, Unnotified
from redrive.store.database import DEFAULT_PATH, READ_ONLY, StoreUnavailable, database_url, engine
from redrive.store.keys import held_back, key_active, lock_keys, ordered_keys, release_keys
from redrive.store.matching import chunks, record_is
from redrive.store.rows import (
    EVERY_ROW,
    Coordinates,
    Entry,
    RecordState,
    RowFilter,
    StoredRetry,
    Success,
    key_digest,
)
from redrive.store.schema import ACTIVE, DEAD, FINAL, IN_FLIGHT, PARKED, PENDING, retries

FIRST_ANALYZE_ROWS = 1_000
LAST_ANALYZE_ROWS = 1_000_000
# Tries of a writing transaction that PostgreSQL aborts to break a deadlock.
DEADLOCK_TRIES = 3


class UnknownRetry(RedriveError, LookupError):
    def __init__(self, retry_id: int) -> None:
        self.retry_id = retry_id
        super().__init__(f"no stored retry with id={retry_id}")


class RetryStore:
    """The durable retry store. `url`: a file path (SQLite) or a SQLAlchemy database URL;
    `create=False` for a SQLite file that must exist already (tools that only look or act on
    what a store holds)."""

    def __init__(self, url: str | Path = DEFAULT_PATH, *, migrate: bool = True,
                 create: bool = True) -> None:
        self.url = database_url(url, create=create)
        try:
            self.engine: Engine = engine(self.url)
        except (ArgumentError, ValueError) as exc:  # ValueError: make_url's, e.g. a bad port
            raise InvalidArgument("url", str(url), str(exc)) from exc
        self.dialect = self.engine.dialect.name
        self._rows_written = 0
        self._analyze_at = FIRST_ANALYZE_ROWS
        if migrate:
            self.migrate()

    def __repr__(self) -> str:
        return f"RetryStore({self.display_url!r})"

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> RetryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _begin(self, *, read_only: bool = False) -> Iterator[Connection]:
        try:
            with self._connect() as conn:
                conn.execution_options(**{READ_ONLY: read_only})
                with conn.begin():
                    yield conn
        except OperationalError as exc:
            raise StoreUnavailable(self.display_url, str(exc.orig or exc).strip()) from exc

    def _write(self, body: Callable[[Connection], None]) -> None:
        """`body` in a writing transaction, run again when PostgreSQL aborts it to break a
        deadlock: a scheduler's marks and a runtime's outcomes can lock the same rows in
        opposite orders, and the runtime's batch would be handled again, or the marks wait."""
        tries = 1
        while True:
            try:
                with self._begin() as conn:
                    body(conn)
                return
            except StoreUnavailable as exc:
                orig = getattr(exc.__cause__, "orig", None)
                if tries == DEADLOCK_TRIES or getattr(orig, "sqlstate", None) != "40P01":
                    raise
                tries += 1

    def _connect(self) -> Connection:
        try:
            return self.engine.connect()
        except DatabaseError as exc:  # unreachable, or a file that is not a database
            raise StoreUnavailable(self.display_url, str(exc.orig or exc).strip()) from exc

    # --- schema --------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Bring the schema to the latest version; return the versions applied now."""
        with self._begin() as conn:
            return schema.migrate(conn, self.display_url)

    def schema_version(self) -> int:
        with self._begin(read_only=True) as conn:
            return schema.current_version(conn)

    # --- what the runtimes write and look up (see outcomes) ----------------------------------

    def write(self, entries: Sequence[Entry], successes: Sequence[Success],
              at_ms: int | None = None) -> None:
        """Record one batch's outcomes in one transaction (see outcomes.Outcomes.write)."""
        batch = outcomes.Outcomes(entries, successes, now_ms() if at_ms is None else at_ms)

        def write(conn: Connection) -> None:
            batch.write(conn, self.dialect)
            self._keep_statistics(conn, len(entries))

        self._write(write)

    def _keep_statistics(self, conn: Connection, written: int) -> None:
        """ANALYZE the table on PostgreSQL after 1,000 rows written by this store, then after
        2,000, 4,000, ... up to LAST_ANALYZE_ROWS. A new table has no statistics until
        autovacuum's first pass (up to a minute, and a tenth of the table, later); until then
        the planner reads a record lookup as a scan of the group's whole history (20 ms per
        partition at 40,000 rows, 0.4 ms with statistics)."""
        self._rows_written += written
        if self.dialect != "postgresql" or self._rows_written < self._analyze_at \
                or self._analyze_at > LAST_ANALYZE_ROWS:
            return
        self._analyze_at *= 2
        conn.execute(text(f"ANALYZE {retries.name}"))

    def find_record(self, group: str, topic: str, partition: int,
                    offset: int) -> StoredRetry | None:
        with self._begin(read_only=True) as conn:
            row = conn.execute(select(retries).where(
                record_is(group, topic, partition, offset))).first()
        return None if row is None else StoredRetry.shown(row)

    def key_active(self, group: str, topic: str, key: bytes) -> bool:
        """Whether a record with this key waits in the store for this group (ordering)."""
        with self._begin(read_only=True) as conn:
            return key_active(conn, group, topic, key)

    def record_states(self, group: str, origins: Iterable[Coordinates]
                      ) -> dict[Coordinates, RecordState]:
        """Where the rows of many records of one group stand, by their (topic, partition,
        offset); an absent row is left out."""
        wanted = sorted(set(origins))
        if not wanted:
            return {}
        with self._begin(read_only=True) as conn:
            return outcomes.record_states(conn, group, wanted)

    def active_keys(self, group: str, keys: Iterable[tuple[str, bytes]]
                    ) -> set[tuple[str, bytes]]:
        """`key_active` for many (topic, key) of one group: those with a record waiting."""
        wanted = set(keys)
        if not wanted:
            return set()
        digests = list({(topic, key_digest(key)) for topic, key in wanted})
        with self._begin(read_only=True) as conn:
            active = outcomes.active_keys(conn, group, digests)
        return {(topic, key) for topic, key in wanted if (topic, key_digest(key)) in active}

    # --- what the scheduler does (see claims) ------------------------------------------------

    @contextmanager
    def take_due(self, limit: int, at_ms: int | None = None, *,
                 settling: DueBatch | None = None) -> Iterator[DueBatch]:
        """Claim up to `limit` due pending rows for the caller (see DueBatch).

        When the block ends, what it marked is written in one transaction, and the rows it did
        not mark are made pending again (if it raised, also those it meant to mark dead),
        unless it deferred the batch: then `settling`, given to a later claim, writes them in
        that claim's transaction. If the process dies instead, they stay claimed until
        `reclaim_expired` finds their claim older than its `claim_ms`.
        """
        at = now_ms() if at_ms is None else at_ms
        with self._begin() as conn:
            if settling is not None:
                claims.settle(conn, settling)
            taken = claims.claim_due(conn, limit, at)
        # Decoded once the lock is released.
        batch = claims.due_batch(taken, at)
        try:
            yield batch
        except BaseException:
            # What was dispatched is in flight; the rest is handed back, and what the block
            # meant to mark dead is decided again by the next pass.
            batch.dead.clear()
            self._release_claims(batch)
            raise
        if not batch.deferred:
            self.settle(batch)

    def settle(self, batch: DueBatch) -> None:
        """Write what the claimer of `batch` marked, and hand back the rows it did not."""
        if batch.dispatched or batch.dead or batch.held or batch.unsettled:
            self._write(lambda conn: claims.settle(conn, batch))

    def _release_claims(self, batch: DueBatch) -> None:
        # Unreachable now, they come back when their claim runs out.
        with suppress(StoreUnavailable):
            self.settle(batch)

    @contextmanager
    def take_unnotified(self, limit: int) -> Iterator[Unnotified]:
        """Dead rows whose notification has not fired, claimed for the caller (other
        schedulers skip them) in a transaction of its own, so that no lock is held while the
        caller's hooks run; when the block ends, those passed to `notified()` are marked and
        the others handed back. Should the caller die first, `release_notification_claims`
        hands them back."""
        # Asked first without writing: on SQLite a writing transaction takes the database's one
        # write lock, which the runtimes' batches would wait for at every idle pass.
        with self._begin(read_only=True) as conn:
            waiting = claims.any_unnotified(conn)
        batch = Unnotified([])
        if waiting:
            with self._begin() as conn:
                batch = claims.take_unnotified(conn, limit, now_ms())
        try:
            yield batch
        finally:
            if batch.rows:
                with self._begin() as conn:
                    claims.mark_notified(conn, batch, now_ms())

    def release_notification_claims(self, claim_ms: int, at_ms: int | None = None) -> int:
        """Dead rows claimed for notification at least `claim_ms` ago by a scheduler that died
        meanwhile, to be notified again; return how many."""
        with self._begin() as conn:
            return claims.release_notification_claims(
                conn, claim_ms, now_ms() if at_ms is None else at_ms)

    def reclaim_expired(self, lease_ms: int, claim_ms: int | None = None,
                        at_ms: int | None = None) -> int:
        """Make pending again the in-flight rows whose copy went out at least `lease_ms` ago and
        was never reported handled (a copy lost to retention, an offset reset or a deleted
        topic), and those claimed at least `claim_ms` (default: `lease_ms`) ago and never
        dispatched (their scheduler died), so that the next pass republishes them; return how
        many.

        Their due time is kept: they are that late, and come first. A copy that was only slow
        and is handled after this is handled once more from the new copy only if that one is
        read before the row is marked succeeded: at least once, never lost.
        """
        at = now_ms() if at_ms is None else at_ms
        with self._begin() as conn:
            return claims.reclaim_expired(conn, lease_ms,
                                          lease_ms if claim_ms is None else claim_ms, at)

    def release_orphans(self, at_ms: int | None = None) -> int:
        """Release the first parked record of keys with nothing else active (a safety net for
        a head removed by hand, e.g. purged); return how many were released."""
        with self._begin() as conn:
            return claims.release_orphans(conn, now_ms() if at_ms is None else at_ms)

    # --- inspection and operator actions -------------------------------------------------------

    def find(self, where: RowFilter = EVERY_ROW, *, limit: int | None = 100,
             at_ms: int | None = None) -> list[StoredRetry]:
        at = now_ms() if at_ms is None else at_ms
        query = select(retries).where(where.where(at)).order_by(retries.c.id).limit(limit)
        with self._begin(read_only=True) as conn:
            return [StoredRetry.shown(r) for r in conn.execute(query)]

    def get(self, retry_id: int) -> StoredRetry:
        found = self.find(RowFilter(ids=(retry_id,)), limit=1)
        if not found:
            raise UnknownRetry(retry_id)
        return found[0]

    def counts(self, where: RowFilter = EVERY_ROW) -> dict[str, int]:
        query = (select(retries.c.status, func.count()).where(where.where(now_ms()))
                 .group_by(retries.c.status))
        with self._begin(read_only=True) as conn:
            return {status: int(n) for status, n in conn.execute(query)}

    def counts_by_group(self) -> dict[tuple[str, str], dict[str, int]]:
        """Rows per (group, original topic) and status."""
        c = retries.c
        query = (select(c.group_id, c.topic, c.status, func.count())
                 .group_by(c.group_id, c.topic, c.status))
        out: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
        with self._begin(read_only=True) as conn:
            for group, topic, status, count in conn.execute(query):
                out[(group, topic)][status] = int(count)
        return dict(out)

    def waiting_by_group(self) -> dict[tuple[str, str], tuple[int, int, int | None]]:
        """Per (group, original topic), rows not finished (pending, in flight or parked): how
        many, the oldest row's creation time, and the earliest due time of the pending ones
        (None if none is: a parked row's due time is when it was parked, and an in-flight one
        is published already)."""
        c = retries.c
        query = (select(c.group_id, c.topic, func.count(), func.min(c.created_ms),
                        func.min(case((c.status == PENDING, c.due_ms))))
                 .where(c.status.in_(ACTIVE)).group_by(c.group_id, c.topic))
        with self._begin(read_only=True) as conn:
            return {(group, topic): (int(count), int(oldest), None if due is None else int(due))
                    for group, topic, count, oldest, due in conn.execute(query)}

    def oldest_pending_due_ms(self) -> int | None:
        """The earliest due time among pending rows (indexed: the scheduler asks every pass)."""
        query = select(func.min(retries.c.due_ms)).where(retries.c.status == PENDING)
        with self._begin(read_only=True) as conn:
            found = conn.execute(query).scalar()
        return None if found is None else int(found)

    def requeue(self, where: RowFilter, *, due_ms: int | None = None,
                reset_attempts: bool = False) -> int:
        """Make matching dead, cancelled, pending or in-flight rows pending again, due at
        `due_ms` (now by default); return how many. Parked rows wait for their key instead, and
        so do requeued rows of a key kept in order but its first (see keys.held_back)."""
        at = now_ms()
        values: dict[str, Any] = {"status": PENDING, "due_ms": at if due_ms is None else due_ms,
                                  "reason": None, "notified_ms": None, "updated_ms": at}
        if reset_attempts:
            values["attempt"] = 0
        chosen = and_(where.where(at), retries.c.status.in_((DEAD, schema.CANCELLED, PENDING,
                                                              IN_FLIGHT)))
        c = retries.c
        in_order = and_(c.ordered, c.key.is_not(None))
        with self._begin() as conn:
            # A writer of these keys (a consumer's outcomes) waits until this commits.
            lock_keys(conn, self.dialect, ordered_keys(conn, chosen))
            # Only rows of keys kept in order come back to be parked: a requeue of a million
            # other rows reads none of them.
            made_pending = conn.execute(update(retries).where(chosen, in_order).values(**values)
                                        .returning(c.id, c.group_id, c.topic, c.key,
                                                   c.partition, c.offset)).all()
            others = conn.execute(update(retries).where(chosen, ~in_order).values(**values))
            for part in chunks(held_back(conn, made_pending)):
                conn.execute(update(retries).where(c.id.in_(part)).values(status=PARKED,
                                                                          updated_ms=at))
            return len(made_pending) + int(others.rowcount)

    def cancel(self, where: RowFilter) -> int:
        """Cancel matching active rows; records parked behind a cancelled one move up."""
        at = now_ms()
        condition = and_(where.where(at), retries.c.status.in_(ACTIVE))
        with self._begin() as conn:
            keys = conn.execute(select(retries.c.group_id, retries.c.topic, retries.c.key)
                                .where(condition)).all()
            lock_keys(conn, self.dialect, [(g, t, k) for g, t, k in keys])
            result = conn.execute(update(retries).where(condition).values(
                status=schema.CANCELLED, updated_ms=at))
            release_keys(conn, [(g, t, k) for g, t, k in keys], at)
            return int(result.rowcount)

    def purge(self, where: RowFilter) -> int:
        """Delete matching rows that are finished (succeeded, dead or cancelled)."""
        active = [s for s in where.statuses if s not in FINAL]
        if active:
            raise InvalidArgument("status", active[0], "purge deletes only finished rows "
                                  f"({', '.join(FINAL)}); cancel active ones first")
        at = now_ms()
        with self._begin() as conn:
            result = conn.execute(delete(retries).where(where.where(at),
                                                        retries.c.status.in_(FINAL)))
            return int(result.rowcount)
