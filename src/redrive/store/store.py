"""RetryStore: failed records (or their coordinates) kept in a database until they are due.

SQLite by default (a file path), PostgreSQL by URL. One row per record and group, keyed by the
record's original topic/partition/offset, so that writing the same failure twice (a consumer
replaying a batch after a crash) changes nothing: a row moves forward only to a higher attempt.

On SQLite every transaction starts with BEGIN IMMEDIATE: writers queue on the database lock
instead of failing when a read lock would have to be upgraded, and two schedulers take turns.
On PostgreSQL, due rows are taken with FOR UPDATE SKIP LOCKED so schedulers share them, and
transactions that park or release records of a key hold an advisory lock on that key.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError
from redrive.store import schema
from redrive.store.database import DEFAULT_PATH, READ_ONLY, StoreUnavailable, database_url, engine
from redrive.store.rows import (
    EVERY_ROW,
    Coordinates,
    Entry,
    RecordState,
    RowFilter,
    StoredRetry,
    Success,
    encode_headers,
    key_digest,
)
from redrive.store.schema import (
    ACTIVE,
    DEAD,
    FINAL,
    IN_FLIGHT,
    PARKED,
    PENDING,
    SUCCEEDED,
    retries,
)

# Records or keys looked up per statement by the bulk lookups: a poll batch's worth, with every
# database's limit on bound parameters far away.
LOOKUP_CHUNK = 500
FIRST_ANALYZE_ROWS = 1_000
LAST_ANALYZE_ROWS = 1_000_000
_T = TypeVar("_T")


class UnknownRetry(RedriveError, LookupError):
    def __init__(self, retry_id: int) -> None:
        self.retry_id = retry_id
        super().__init__(f"no stored retry with id={retry_id}")


@dataclass
class DueBatch:
    """Due rows claimed by one scheduler: in flight, not yet dispatched (`dispatched_ms` None).

    The claim is committed before the caller publishes, so the database's locks are not held
    while the broker acknowledges. What the caller marks is written when its block ends.
    """

    rows: list[StoredRetry]
    dispatched: list[int] = field(default_factory=list)
    dispatched_ms: int = 0
    dead: list[tuple[list[StoredRetry], str, str, int]] = field(default_factory=list)

    def mark_in_flight(self, ids: Iterable[int], at_ms: int) -> None:
        self.dispatched.extend(ids)
        self.dispatched_ms = at_ms

    def mark_dead(self, rows: Sequence[StoredRetry], reason: str, why: str, at_ms: int) -> None:
        if rows:
            self.dead.append((list(rows), reason, why, at_ms))

    @property
    def unsettled(self) -> list[int]:
        settled = set(self.dispatched).union(r.id for rows, *_ in self.dead for r in rows)
        return [row.id for row in self.rows if row.id not in settled]


@dataclass
class Unnotified:
    rows: list[StoredRetry]
    done: list[int] = field(default_factory=list)

    def notified(self, retry_id: int) -> None:
        self.done.append(retry_id)


class RetryStore:
    """The durable retry store. `url`: a file path (SQLite) or a SQLAlchemy database URL."""

    def __init__(self, url: str | Path = DEFAULT_PATH, *, migrate: bool = True) -> None:
        self.url = database_url(url)
        try:
            self.engine: Engine = engine(self.url)
        except ArgumentError as exc:
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
            with self.engine.connect() as conn:
                conn.execution_options(**{READ_ONLY: read_only})
                with conn.begin():
                    yield conn
        except OperationalError as exc:
            raise StoreUnavailable(self.display_url, str(exc.orig or exc).strip()) from exc

    # --- schema --------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Bring the schema to the latest version; return the versions applied now."""
        with self._begin() as conn:
            return schema.migrate(conn, self.display_url)

    def schema_version(self) -> int:
        with self._begin(read_only=True) as conn:
            return schema.current_version(conn)

    # --- what the runtimes write ---------------------------------------------------------------

    def write(self, entries: Sequence[Entry], successes: Sequence[Success],
              at_ms: int | None = None) -> None:
        """Record one batch's outcomes in one transaction.

        Failures first, then successes, then the next parked record of every key whose head
        succeeded or died is released; a parked entry whose key has nothing active by then is
        stored as due at once instead.
        """
        at = now_ms() if at_ms is None else at_ms
        parks = [e for e in entries if e.status == PARKED]
        failures = [e for e in entries if e.status != PARKED]
        # Built before the transaction: on SQLite it holds the database's one write lock.
        failure_rows = [_entry_row(e, at) for e in failures]
        with self._begin() as conn:
            # Only keys kept in order need the lock (a success carries its key only then).
            self._lock_keys(conn, [(e.group, e.topic, e.key) for e in entries if e.ordered]
                            + [(s.group, s.topic, s.key) for s in successes])
            if failures:
                conn.execute(self._upsert(), failure_rows)
            # A statement per partition and attempt, not one per success: under load each round
            # trip costs milliseconds (250 updates of one row each took 0.9 s).
            by_group: dict[str, list[Success]] = defaultdict(list)
            for success in successes:
                by_group[success.group].append(success)
            for group, done in by_group.items():
                for chunk in _chunks(done):
                    for records in _each_attempt(chunk):
                        conn.execute(update(retries).where(
                            retries.c.group_id == group, records,
                            retries.c.status.in_((PENDING, IN_FLIGHT))).values(
                                status=SUCCEEDED, updated_ms=at))
            _release_keys(conn, [(s.group, s.topic, s.key) for s in successes]
                          + [(e.group, e.topic, e.key) for e in failures
                             if e.status == DEAD and e.ordered], at)
            for park in parks:
                blocked = _key_active(conn, park.group, park.topic, park.key)
                row = _entry_row(park, at)
                if not blocked:
                    row.update(status=PENDING, due_ms=at)
                conn.execute(self._upsert(), [row])
            self._keep_statistics(conn, len(entries))

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

    def _upsert(self) -> Any:
        dialect_insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        stmt = dialect_insert(retries)
        x = stmt.excluded
        return stmt.on_conflict_do_update(
            index_elements=[retries.c.group_id, retries.c.topic, retries.c.partition,
                            retries.c.offset],
            set_={"attempt": x.attempt, "first_failure_ms": x.first_failure_ms,
                  "due_ms": x.due_ms, "status": x.status, "reason": x.reason,
                  "error_type": x.error_type, "error_message": x.error_message,
                  "error_trace": x.error_trace, "updated_ms": x.updated_ms,
                  "notified_ms": None},
            # Only forward: a replayed failure, or one reported after a cancel, changes nothing.
            # (IN would expand per statement, which a many-row insert cannot do.)
            where=(retries.c.attempt < x.attempt)
            & or_(*(retries.c.status == status for status in ACTIVE)))

    def _lock_keys(self, conn: Connection, keys: Iterable[tuple[str, str, bytes | None]]) -> None:
        if self.dialect != "postgresql":
            return  # SQLite transactions already run one at a time
        # A 64-bit lock id per (group, topic, key); sorted, so two writers never wait on
        # each other crosswise: unnest yields them in the array's order, one statement for all.
        ids = sorted({_lock_id(g, t, k) for g, t, k in keys if k is not None})
        if ids:
            conn.execute(text("SELECT pg_advisory_xact_lock(lock) "
                              "FROM unnest(CAST(:locks AS bigint[])) AS lock"), {"locks": ids})

    def find_record(self, group: str, topic: str, partition: int,
                    offset: int) -> StoredRetry | None:
        with self._begin(read_only=True) as conn:
            row = conn.execute(select(retries).where(
                _record_is(group, topic, partition, offset))).first()
        return None if row is None else StoredRetry.of(row)

    def key_active(self, group: str, topic: str, key: bytes) -> bool:
        """Whether a record with this key waits in the store for this group (ordering)."""
        with self._begin(read_only=True) as conn:
            return _key_active(conn, group, topic, key)

    def record_states(self, group: str, origins: Iterable[Coordinates]
                      ) -> dict[Coordinates, RecordState]:
        """Where the rows of many records of one group stand, in a statement per partition and
        LOOKUP_CHUNK of them, by their (topic, partition, offset); an absent row is left out.
        Only the two columns are read: a runtime asks this for every copy it reads back."""
        wanted = sorted(set(origins))
        found: dict[Coordinates, RecordState] = {}
        if not wanted:
            return found
        c = retries.c
        with self._begin(read_only=True) as conn:
            for chunk in _chunks(wanted):
                for records in _each_partition(chunk):
                    for topic, partition, offset, status, attempt in conn.execute(
                            select(c.topic, c.partition, c.offset, c.status, c.attempt)
                            .where(c.group_id == group, records)):
                        found[(topic, partition, offset)] = RecordState(status, attempt)
        return found

    def active_keys(self, group: str, keys: Iterable[tuple[str, bytes]]
                    ) -> set[tuple[str, bytes]]:
        """`key_active` for many (topic, key) of one group, in a statement per LOOKUP_CHUNK of
        them: those (topic, key) with a record waiting in the store."""
        wanted = set(keys)
        if not wanted:
            return set()
        # Compared by digest, as key_active does: that is what the key index holds.
        digests = list({(topic, key_digest(key)) for topic, key in wanted})
        c = retries.c
        active: set[tuple[str, str | None]] = set()
        with self._begin(read_only=True) as conn:
            for chunk in _chunks(digests):
                active.update((topic, digest) for topic, digest in conn.execute(
                    select(c.topic, c.key_digest).distinct().where(
                        c.group_id == group, c.status.in_(ACTIVE), _any_key(chunk))))
        return {(topic, key) for topic, key in wanted if (topic, key_digest(key)) in active}

    # --- what the scheduler does ---------------------------------------------------------------

    @contextmanager
    def take_due(self, limit: int, at_ms: int | None = None) -> Iterator[DueBatch]:
        """Claim up to `limit` due pending rows for the caller (see DueBatch).

        When the block ends, what it marked is written in one transaction, and the rows it did
        not mark are made pending again (if it raised, also those it meant to mark dead). If
        the process dies instead, they stay claimed until `reclaim_expired` finds their claim
        older than its `claim_ms`.
        """
        at = now_ms() if at_ms is None else at_ms
        c = retries.c
        query = (select(retries).where(c.status == PENDING, c.due_ms <= at)
                 .order_by(c.due_ms).limit(limit).with_for_update(skip_locked=True))
        with self._begin() as conn:
            taken = conn.execute(query).all()
            if taken:
                conn.execute(update(retries).where(c.id.in_([r.id for r in taken])).values(
                    status=IN_FLIGHT, dispatched_ms=None, updated_ms=at))
        # Decoded once the lock is released.
        rows = [StoredRetry.of(r) for r in taken]
        batch = DueBatch(rows)
        try:
            yield batch
        except BaseException:
            # What was dispatched is in flight; the rest is handed back, and what the block
            # meant to mark dead is decided again by the next pass.
            batch.dead.clear()
            self._release_claims(batch)
            raise
        if batch.dispatched or batch.dead or batch.unsettled:
            self._settle(batch)

    def _settle(self, batch: DueBatch) -> None:
        c = retries.c
        with self._begin() as conn:
            if batch.dispatched:
                at = batch.dispatched_ms
                # A copy may already have been handled (succeeded, or failed again and
                # pending): its row keeps that, and only learns when it was dispatched.
                conn.execute(update(retries).where(
                    c.id.in_(batch.dispatched), c.dispatched_ms.is_(None),
                    c.status.in_((IN_FLIGHT, SUCCEEDED, DEAD))).values(
                        dispatched_ms=at, dispatches=c.dispatches + 1))
            for rows, reason, why, at in batch.dead:
                conn.execute(update(retries).where(
                    c.id.in_([r.id for r in rows]), c.status == IN_FLIGHT,
                    c.dispatched_ms.is_(None)).values(
                        status=DEAD, reason=reason, error_type="redrive.store." + reason,
                        error_message=why, updated_ms=at))
                _release_keys(conn, [(r.group, r.topic, r.key) for r in rows], at)
            if batch.unsettled:
                _unclaim(conn, batch.unsettled)

    def _release_claims(self, batch: DueBatch) -> None:
        # Unreachable now, they come back when their claim runs out.
        with suppress(StoreUnavailable):
            self._settle(batch)

    @contextmanager
    def take_unnotified(self, limit: int) -> Iterator[Unnotified]:
        """Dead rows whose notification has not fired, locked until the block ends; those
        passed to `notified()` are marked when it ends."""
        query = (select(retries).where(retries.c.status == DEAD, retries.c.notified_ms.is_(None))
                 .order_by(retries.c.id).limit(limit).with_for_update(skip_locked=True))
        with self._begin() as conn:
            batch = Unnotified([StoredRetry.of(r) for r in conn.execute(query)])
            yield batch
            if batch.done:
                conn.execute(update(retries).where(retries.c.id.in_(batch.done))
                             .values(notified_ms=now_ms()))

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
        claim = lease_ms if claim_ms is None else claim_ms
        c = retries.c
        with self._begin() as conn:
            result = conn.execute(update(retries).where(
                c.status == IN_FLIGHT,
                or_(c.dispatched_ms <= at - lease_ms,
                    and_(c.dispatched_ms.is_(None), c.updated_ms <= at - claim)))
                .values(status=PENDING, updated_ms=at))
            return int(result.rowcount)

    def release_orphans(self, at_ms: int | None = None) -> int:
        """Release the first parked record of keys with nothing else active (a safety net for
        a head removed by hand, e.g. purged); return how many were released."""
        at = now_ms() if at_ms is None else at_ms
        with self._begin() as conn:
            heads = conn.execute(select(retries.c.group_id, retries.c.topic, retries.c.key)
                                 .where(retries.c.status == PARKED)
                                 .group_by(retries.c.group_id, retries.c.topic,
                                           retries.c.key_digest, retries.c.key)).all()
            return _release_keys(conn, [(g, t, k) for g, t, k in heads], at)

    # --- inspection and operator actions -------------------------------------------------------

    def find(self, where: RowFilter = EVERY_ROW, *, limit: int | None = 100,
             at_ms: int | None = None) -> list[StoredRetry]:
        at = now_ms() if at_ms is None else at_ms
        query = select(retries).where(where.where(at)).order_by(retries.c.id).limit(limit)
        with self._begin(read_only=True) as conn:
            return [StoredRetry.of(r) for r in conn.execute(query)]

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

    def waiting_by_group(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Per (group, original topic), rows not finished (pending, in flight or parked): how
        many, the oldest row's creation time and the earliest due time."""
        c = retries.c
        query = (select(c.group_id, c.topic, func.count(), func.min(c.created_ms),
                        func.min(c.due_ms))
                 .where(c.status.in_(ACTIVE)).group_by(c.group_id, c.topic))
        with self._begin(read_only=True) as conn:
            return {(group, topic): (int(count), int(oldest), int(due))
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
        `due_ms` (now by default); return how many. Parked rows wait for their key instead."""
        at = now_ms()
        values: dict[str, Any] = {"status": PENDING, "due_ms": at if due_ms is None else due_ms,
                                  "reason": None, "notified_ms": None, "updated_ms": at}
        if reset_attempts:
            values["attempt"] = 0
        with self._begin() as conn:
            result = conn.execute(update(retries).where(
                where.where(at), retries.c.status.in_((DEAD, schema.CANCELLED, PENDING,
                                                       IN_FLIGHT))).values(**values))
            return int(result.rowcount)

    def cancel(self, where: RowFilter) -> int:
        """Cancel matching active rows; records parked behind a cancelled one move up."""
        at = now_ms()
        condition = and_(where.where(at), retries.c.status.in_(ACTIVE))
        with self._begin() as conn:
            keys = conn.execute(select(retries.c.group_id, retries.c.topic, retries.c.key)
                                .where(condition)).all()
            self._lock_keys(conn, [(g, t, k) for g, t, k in keys])
            result = conn.execute(update(retries).where(condition).values(
                status=schema.CANCELLED, updated_ms=at))
            _release_keys(conn, [(g, t, k) for g, t, k in keys], at)
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


# --- helpers -------------------------------------------------------------------------------------


def _record_is(group: str, topic: str, partition: int, offset: int) -> ColumnElement[bool]:
    c = retries.c
    return and_(c.group_id == group, c.topic == topic, c.partition == partition,
                c.offset == offset)


def _each_partition(chunk: Sequence[Coordinates]) -> Iterator[ColumnElement[bool]]:
    """These records, as one condition per partition: `topic = t AND partition = p AND offset
    IN (...)`, which the record index serves. ORed into one statement they are not: the planner
    then reads every row of the group and topic (a table's whole history) and filters them."""
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, partition, offset in chunk:
        offsets[(topic, partition)].append(offset)
    c = retries.c
    for (topic, partition), listed in offsets.items():
        yield and_(c.topic == topic, c.partition == partition, c.offset.in_(listed))


def _each_attempt(chunk: Sequence[Success]) -> Iterator[ColumnElement[bool]]:
    """These records at their attempt, as one condition per partition and attempt (see
    _each_partition)."""
    offsets: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for success in chunk:
        offsets[(success.topic, success.partition, success.attempt)].append(success.offset)
    c = retries.c
    for (topic, partition, attempt), listed in offsets.items():
        yield and_(c.topic == topic, c.partition == partition, c.offset.in_(listed),
                   c.attempt == attempt)


def _any_key(chunk: Sequence[tuple[str, str | None]]) -> ColumnElement[bool]:
    """One of these (topic, key digest): a digest list per topic, served by the key index."""
    digests: dict[str, list[str | None]] = defaultdict(list)
    for topic, digest in chunk:
        digests[topic].append(digest)
    c = retries.c
    return or_(*(and_(c.topic == topic, c.key_digest.in_(listed))
                 for topic, listed in digests.items()))


def _chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), LOOKUP_CHUNK):
        yield items[start:start + LOOKUP_CHUNK]


def _unclaim(conn: Connection, ids: Sequence[int]) -> None:
    """Claimed rows back to pending, unless a copy of theirs was handled meanwhile."""
    c = retries.c
    conn.execute(update(retries).where(c.id.in_(ids), c.status == IN_FLIGHT,
                                       c.dispatched_ms.is_(None)).values(status=PENDING))


def _key_is(group: str, topic: str, key: bytes | None) -> ColumnElement[bool]:
    c = retries.c
    return and_(c.group_id == group, c.topic == topic, c.key_digest == key_digest(key))


def _key_active(conn: Connection, group: str, topic: str, key: bytes | None, *,
                parked: bool = True) -> bool:
    if key is None:
        return False
    statuses = ACTIVE if parked else (PENDING, IN_FLIGHT)
    return conn.execute(select(retries.c.id).where(
        _key_is(group, topic, key), retries.c.status.in_(statuses)).limit(1)).first() is not None


def _release_keys(conn: Connection, keys: Iterable[tuple[str, str, bytes | None]],
                  at: int) -> int:
    released = 0
    for group, topic, key in {k for k in keys if k[2] is not None}:
        if _key_active(conn, group, topic, key, parked=False):
            continue
        head = conn.execute(select(retries.c.id).where(
            _key_is(group, topic, key), retries.c.status == PARKED)
            .order_by(retries.c.partition, retries.c.offset).limit(1)).scalar()
        if head is not None:
            conn.execute(update(retries).where(retries.c.id == head).values(
                status=PENDING, due_ms=at, updated_ms=at))
            released += 1
    return released


def _lock_id(group: str, topic: str, key: bytes) -> int:
    digest = hashlib.sha1(b"\0".join((group.encode(), topic.encode(), key)),
                          usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _entry_row(entry: Entry, at: int) -> dict[str, Any]:
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
    }
