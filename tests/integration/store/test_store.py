"""The store itself, on SQLite and PostgreSQL: schema versions, forward-only writes, per-key
parking and release, and the operator actions (requeue, cancel, purge) with their filters."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text, update

from redrive.clock import now_ms
from redrive.dev.postgres import DevPostgres
from redrive.errors import InvalidArgument
from redrive.store import RetryStore, RowFilter, claims
from redrive.store.rows import Success, key_digest
from redrive.store.schema import (
    CANCELLED,
    DEAD,
    IN_FLIGHT,
    LATEST,
    MIGRATIONS,
    PARKED,
    PENDING,
    SUCCEEDED,
    SchemaTooNew,
    versions,
)

from .conftest import ExternalPostgres, entry


def test_schema_is_created_once_even_by_concurrent_openers(store_url: str) -> None:
    opened: list[RetryStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(RetryStore(store_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert [s.schema_version() for s in opened] == [LATEST] * 4
    assert opened[0].migrate() == []  # nothing left to apply
    with opened[0].engine.connect() as conn:
        assert conn.execute(versions.select()).all()[0].version == 1
        assert len(conn.execute(versions.select()).all()) == LATEST
    for store in opened:
        store.close()


def test_a_store_of_the_first_schema_gains_the_ordered_column_with_its_rows_kept(
        store_url: str) -> None:
    first = RetryStore(store_url, migrate=False)
    try:
        with first.engine.begin() as conn:
            versions.create(conn)
            MIGRATIONS[0].apply(conn)
            conn.execute(versions.insert().values(version=1, description="v1", applied_ms=0))
            for offset in (4, 5):  # two dead rows of one key
                conn.execute(text(
                    "INSERT INTO redrive_retries (group_id, topic, partition, \"offset\", "
                    "\"key\", key_digest, mode, attempt, due_ms, status, created_ms, "
                    "updated_ms) VALUES ('g', 't', 0, :offset, :key, :digest, 'reference', 1, "
                    "0, 'dead', 0, 0)"),
                    {"offset": offset, "key": b"k", "digest": key_digest(b"k")})
    finally:
        first.close()
    store = RetryStore(store_url)
    try:
        assert store.schema_version() == LATEST == 4
        assert [(r.offset, r.status) for r in store.find(RowFilter(group="g"))] == [
            (4, DEAD), (5, DEAD)]
        with store.engine.connect() as conn:
            assert [bool(row[0]) for row in conn.execute(text(
                "SELECT ordered FROM redrive_retries"))] == [False, False]
        # Old rows recorded no order: both go at once, none is parked.
        assert store.requeue(RowFilter(group="g")) == 2
        assert {r.status for r in store.find(RowFilter(group="g"))} == {PENDING}
    finally:
        store.close()


def test_a_newer_schema_is_refused_naming_its_version(store: RetryStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(versions.insert().values(version=LATEST + 7, description="future",
                                              applied_ms=0))
    with pytest.raises(SchemaTooNew, match=f"schema version {LATEST + 7} is newer"):
        RetryStore(store.url)


def test_writes_only_move_forward(store: RetryStore) -> None:
    store.write([entry("g", "t", 5, attempt=1)], [])
    store.write([entry("g", "t", 5, attempt=2, due_ms=123)], [])
    # A replayed, older failure (a consumer that crashed before committing) changes nothing.
    store.write([entry("g", "t", 5, attempt=1, due_ms=999)], [])
    row = store.find(RowFilter(group="g"))[0]
    assert (row.attempt, row.due_ms, row.status) == (2, 123, PENDING)
    assert row.headers == [("trace-id", b"t-5")] and row.value == b"v"

    # A success counts only for the attempt the row is at, and only once.
    store.write([], [Success("g", "t", 0, 5, 1, None)])
    assert store.get(row.id).status == PENDING
    store.write([], [Success("g", "t", 0, 5, 2, None)])
    assert store.get(row.id).status == SUCCEEDED
    store.write([entry("g", "t", 5, attempt=3)], [])
    assert store.get(row.id).status == SUCCEEDED
    assert store.find_record("g", "t", 0, 5) == store.get(row.id)
    assert store.find_record("other", "t", 0, 5) is None


def test_parked_records_are_released_one_at_a_time_in_offset_order(store: RetryStore) -> None:
    store.write([entry("g", "t", 1, key=b"k")], [])
    assert store.key_active("g", "t", b"k") and not store.key_active("g", "t", b"other")
    store.write([entry("g", "t", o, key=b"k", status=PARKED, attempt=0) for o in (3, 2)], [])
    status = {r.offset: r.status for r in store.find(RowFilter(group="g"))}
    assert status == {1: PENDING, 2: PARKED, 3: PARKED}

    store.write([], [Success("g", "t", 0, 1, 1, b"k")])
    status = {r.offset: r.status for r in store.find(RowFilter(group="g"))}
    assert status == {1: SUCCEEDED, 2: PENDING, 3: PARKED}

    # The released head dies: the next one moves up.
    store.write([entry("g", "t", 2, key=b"k", status=DEAD, attempt=1, reason="exhausted",
                       ordered=True)], [])
    status = {r.offset: r.status for r in store.find(RowFilter(group="g"))}
    assert status == {1: SUCCEEDED, 2: DEAD, 3: PENDING}

    # A record parked after its key went quiet is due at once instead.
    store.write([], [Success("g", "t", 0, 3, 0, b"k")])
    assert store.find_record("g", "t", 0, 3).status == SUCCEEDED  # type: ignore[union-attr]
    store.write([entry("g", "t", 9, key=b"k", status=PARKED, attempt=0)], [])
    assert store.find_record("g", "t", 0, 9).status == PENDING  # type: ignore[union-attr]


def test_cancelling_a_head_releases_the_next_and_purge_keeps_active_rows(
        store: RetryStore) -> None:
    store.write([entry("g", "t", 1, key=b"k")], [])
    store.write([entry("g", "t", 2, key=b"k", status=PARKED, attempt=0)], [])
    assert store.cancel(RowFilter(ids=(store.find_record("g", "t", 0, 1).id,))) == 1  # type: ignore[union-attr]
    assert {r.offset: r.status for r in store.find()} == {1: CANCELLED, 2: PENDING}
    assert store.purge(RowFilter(group="g")) == 1  # only the cancelled one
    assert [r.offset for r in store.find()] == [2]
    with pytest.raises(InvalidArgument, match="invalid status='pending'"):
        store.purge(RowFilter(statuses=(PENDING,)))


def test_filters_requeue_and_release_of_orphans(store: RetryStore) -> None:
    old = now_ms() - 3_600_000
    store.write([entry("g1", "a", 1, status=DEAD, reason="exhausted", error_type="x.Timeout"),
                 entry("g1", "b", 2, status=DEAD, reason="exhausted", error_type="x.Other"),
                 entry("g2", "a", 3)], [], at_ms=old)
    store.write([entry("g1", "a", 4, status=DEAD, reason="not-retryable",
                       error_type="x.Timeout")], [])
    assert [r.offset for r in store.find(RowFilter(error_type="Timeout"))] == [1, 4]
    assert [r.offset for r in store.find(RowFilter(older_than_ms=60_000))] == [1, 2, 3]
    assert [r.offset for r in store.find(RowFilter(newer_than_ms=60_000))] == [4]
    assert store.counts(RowFilter(group="g1")) == {DEAD: 3}

    assert store.requeue(RowFilter(group="g1", topic="a", statuses=(DEAD,)),
                         reset_attempts=True) == 2
    requeued = store.find(RowFilter(group="g1", topic="a"))
    assert [(r.status, r.attempt, r.reason) for r in requeued] == [(PENDING, 0, None)] * 2

    # A head deleted by hand would strand its parked followers; the sweep releases them.
    store.write([entry("g3", "t", 7, key=b"k", status=PARKED, attempt=0),
                 entry("g3", "t", 8, key=b"k", status=PARKED, attempt=0)], [])
    with store.engine.begin() as conn:
        from redrive.store.schema import retries
        conn.execute(update(retries).where(retries.c.offset.in_((7, 8)))
                     .values(status=PARKED))
    assert store.release_orphans() == 1
    assert [r.status for r in store.find(RowFilter(group="g3"))] == [PENDING, PARKED]


def test_due_rows_are_claimed_once_and_those_not_sent_are_handed_back(store: RetryStore) -> None:
    store.write([entry("g", "t", o, due_ms=now_ms() - 10) for o in range(3)]
                + [entry("g", "t", 9, due_ms=now_ms() + 60_000)], [])
    with pytest.raises(RuntimeError), store.take_due(10) as batch:
        assert sorted(r.offset for r in batch.rows) == [0, 1, 2]
        with store.take_due(10) as other:
            assert other.rows == []  # claimed: no other scheduler takes them meanwhile
        raise RuntimeError("the brokers are unreachable")
    assert store.counts() == {PENDING: 4}
    with pytest.raises(RuntimeError), store.take_due(2) as batch:
        assert len(batch.rows) == 2
        sent = batch.rows[0].offset
        batch.mark_in_flight([batch.rows[0].id], now_ms())
        raise RuntimeError("failed after the copy of the first was acknowledged")
    assert store.counts() == {IN_FLIGHT: 1, PENDING: 3}
    with store.take_due(10) as batch:  # the other two due; the one not due is left
        assert sorted(r.offset for r in batch.rows) == sorted({0, 1, 2} - {sent})
        batch.mark_in_flight([batch.rows[0].id], now_ms())
    assert store.counts() == {IN_FLIGHT: 2, PENDING: 2}  # one marked, one handed back


def test_bad_arguments_name_field_and_value(tmp_path: object) -> None:
    with pytest.raises(InvalidArgument, match="invalid url='mysql://x/y'"):
        RetryStore("mysql://x/y")
    with pytest.raises(InvalidArgument, match="invalid status='lost'"):
        RowFilter(statuses=("lost",))
    with pytest.raises(InvalidArgument, match="invalid mode='copy'"):
        entry("g", "t", 1, mode="copy")


def test_a_new_postgresql_table_gets_statistics_as_it_grows(store: RetryStore) -> None:
    """Without them the planner reads a record lookup as a scan of the group's history."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite's planner needs no statistics to pick the record index")

    def analyzed() -> float:
        # The rows ANALYZE counted (-1 before the first), kept in the catalog at once.
        with store.engine.connect() as conn:
            return float(conn.execute(text(
                "SELECT reltuples FROM pg_class WHERE relname = 'redrive_retries'")).scalar())

    store.write([entry("g", "t", offset) for offset in range(999)], [])
    assert analyzed() == -1
    store.write([entry("g", "t", 999)], [])  # the 1,000th row
    assert analyzed() == 1000
    store.write([entry("g", "t", offset) for offset in range(1000, 1999)], [])
    assert analyzed() == 1000  # the next at 2,000
    store.write([entry("g", "t", 1999)], [])
    assert analyzed() == 2000
    with store.engine.connect() as conn:
        plan = "\n".join(row[0] for row in conn.execute(text(
            "EXPLAIN SELECT * FROM redrive_retries WHERE group_id = 'g' AND topic = 't' "
            "AND partition = 0 AND \"offset\" = ANY(ARRAY[5, 50, 500])")))
    assert "redrive_retries_record" in plan, plan


def test_requeue_lets_a_key_kept_in_order_go_one_row_at_a_time(store: RetryStore) -> None:
    """Several dead rows of one key requeued together were republished together, so a later
    record of the key was handled while an earlier one still failed."""
    dead = {"status": DEAD, "reason": "exhausted"}
    store.write([entry("g", "t", o, key=b"k", ordered=True, **dead) for o in (5, 2, 9)]
                + [entry("g", "t", o, key=b"u", **dead) for o in (3, 4)]  # order not kept
                + [entry("g", "t", 7, key=b"b", ordered=True, **dead),
                   entry("g", "t", 8, key=b"b", ordered=True)], [])  # b@8 is pending already

    def statuses() -> dict[tuple[bytes | None, int], str]:
        return {(r.key, r.offset): r.status for r in store.find(RowFilter(group="g"))}

    assert store.requeue(RowFilter(group="g", statuses=(DEAD,))) == 6
    assert statuses() == {(b"k", 2): PENDING, (b"k", 5): PARKED, (b"k", 9): PARKED,
                          (b"u", 3): PENDING, (b"u", 4): PENDING,
                          (b"b", 7): PARKED, (b"b", 8): PENDING}
    # The head handled, the next of its key goes, and only it.
    store.write([], [Success("g", "t", 0, 2, 1, b"k")])
    assert [statuses()[(b"k", o)] for o in (2, 5, 9)] == [SUCCEEDED, PENDING, PARKED]
    store.write([], [Success("g", "t", 0, 8, 1, b"b")])
    assert statuses()[(b"b", 7)] == PENDING


def test_a_record_parked_while_the_scheduler_kills_its_head_is_released_with_it(
        postgres: DevPostgres | ExternalPostgres) -> None:
    """On PostgreSQL (SQLite runs its writers one at a time) a consumer's outcomes and a
    scheduler's marks run at once. A record the consumer parked while the scheduler marked the
    key's head dead saw that head still in flight, and the release in the scheduler's
    transaction did not see the new parked row: it stayed parked until the orphan sweep, half
    a minute later."""
    store = RetryStore(postgres.create_database())
    try:
        store.write([entry("g", "t", 1, key=b"k", ordered=True, due_ms=now_ms() - 10)], [])
        with store.take_due(10) as batch:
            batch.mark_dead(batch.rows, "unknown-topic", "the target is gone", now_ms())
            batch.defer()
        parked = entry("g", "t", 2, key=b"k", status=PARKED, attempt=0, ordered=True)
        with store.engine.connect() as conn:
            marking = conn.begin()
            claims.settle(conn, batch)
            consumer = threading.Thread(target=store.write, args=([parked], []))
            consumer.start()
            consumer.join(1.0)
            assert consumer.is_alive(), "the consumer's write did not wait for the marks"
            marking.commit()
        consumer.join(30)
        assert not consumer.is_alive()
        assert {r.offset: r.status for r in store.find(RowFilter(group="g"))} == {
            1: DEAD, 2: PENDING}
    finally:
        store.close()
