"""Per-batch prefetch of the store backend, on SQLite and PostgreSQL: the bulk lookups answer as
the single ones do, admit gives the same verdicts with and without a prefetch, and a prefetched
batch costs a statement per LOOKUP_CHUNK records instead of one per record."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, update

from redrive.backends import BoundBackend, Verdict
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Delivery, Origin, Record
from redrive.routing import Retry
from redrive.store import RetryStore, StoreBackend, matching
from redrive.store.rows import RecordState, RowFilter, Success
from redrive.store.schema import (
    CANCELLED,
    DEAD,
    IN_FLIGHT,
    PARKED,
    PENDING,
    SUCCEEDED,
    retries,
)

from ..consumer.conftest import FAST_GROUP, produce, wait_until
from .conftest import Background, entry, scheduler

GROUP, TOPIC = "g", "orders"
NewTopic = Callable[..., str]
UniqueName = Callable[..., str]


def copy(offset: int, attempt: int, *, partition: int = 0, key: bytes | None = None,
         group: str = GROUP) -> Record:
    """A copy the scheduler republished of the record at `offset`, at `attempt`."""
    delivery = Delivery(attempt=attempt, group=group,
                        original=Origin(TOPIC, partition, offset, 1_700_000_000_000))
    return Record(TOPIC, 3, 10_000 + offset, 1, key, b"v", [("redrive-group", b"g")], delivery)


def fresh(offset: int, key: bytes | None, *, partition: int = 0) -> Record:
    """A record consumed for the first time."""
    return Record(TOPIC, partition, offset, 1_700_000_000_000, key, b"v")


def retry(record: Record) -> Retry:
    return Retry(TOPIC, now_ms() + 60_000, [], record.delivery.attempt + 1, None)


@contextmanager
def statements(store: RetryStore) -> Iterator[list[str]]:
    """The statements run on the store's tables while the block runs (BEGIN, COMMIT left out)."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "redrive_retries" in statement:
            seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", count)


def test_bulk_lookups_answer_as_the_single_ones(store: RetryStore,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store.write([entry(GROUP, TOPIC, o, partition=p, key=b"p%d-k%d" % (p, o))
                 for p in (0, 1) for o in range(12)]
                + [entry("other", TOPIC, 20, key=b"other-group"),
                   entry(GROUP, "elsewhere", 21, key=b"other-topic")], [])
    store.write([entry(GROUP, TOPIC, 3, key=b"p0-k3", status=DEAD, attempt=2,
                       reason="exhausted")], [])
    store.write([entry(GROUP, TOPIC, 30, key=b"p0-k1", status=PARKED, attempt=0)], [])
    with store.engine.begin() as conn:  # its head gone by hand: only the parked row is active
        conn.execute(update(retries).where(retries.c.partition == 0, retries.c.offset == 1)
                     .values(status=SUCCEEDED))
    store.write([], [Success(GROUP, TOPIC, 0, 5, 1, b"p0-k5")])
    store.cancel(RowFilter(ids=(store.find_record(GROUP, TOPIC, 1, 6).id,)))  # type: ignore[union-attr]
    with store.take_due(1) as due:  # one row in flight
        due.mark_in_flight([due.rows[0].id], now_ms())
    # Small chunks, so that the lookups below span several statements and a partition's
    # offsets are split between two of them.
    monkeypatch.setattr(matching, "LOOKUP_CHUNK", 5)

    origins = [(topic, p, o) for topic in (TOPIC, "elsewhere") for p in (0, 1, 2)
               for o in [*range(14), 20, 21, 30]]
    rows = {origin: store.find_record(GROUP, *origin) for origin in origins}
    assert store.record_states(GROUP, origins) == {
        o: RecordState(r.status, r.attempt) for o, r in rows.items() if r is not None}
    assert {r.status for r in rows.values() if r is not None} == {
        PENDING, IN_FLIGHT, PARKED, SUCCEEDED, DEAD, CANCELLED}
    assert store.record_states("nobody", origins) == {}

    keys = [(topic, b"p%d-k%d" % (p, n)) for topic in (TOPIC, "elsewhere") for p in (0, 1)
            for n in range(14)]
    keys += [(TOPIC, b"other-group"), (TOPIC, b"other-topic"), ("elsewhere", b"other-topic")]
    active = {key for key in keys if store.key_active(GROUP, *key)}
    assert store.active_keys(GROUP, keys) == active
    assert (TOPIC, b"p0-k1") in active  # parked only
    assert not active & {(TOPIC, b"p0-k3"), (TOPIC, b"p0-k5"), (TOPIC, b"p1-k6")}
    assert ("elsewhere", b"other-topic") in active and (TOPIC, b"other-group") not in active
    assert store.record_states(GROUP, []) == {} and store.active_keys(GROUP, []) == set()


def scenario(store: RetryStore) -> None:
    """Rows the batch below meets: waiting, in flight, succeeded, dead, and a busy key."""
    store.write([entry(GROUP, TOPIC, o, attempt=1) for o in range(1, 6)]
                + [entry(GROUP, TOPIC, 40, key=b"busy", attempt=1)], [])
    with store.take_due(10) as due:
        due.mark_in_flight([r.id for r in due.rows if r.offset == 2], now_ms())
    store.write([], [Success(GROUP, TOPIC, 0, 3, 1, None)])
    store.write([entry(GROUP, TOPIC, 4, status=DEAD, attempt=2, reason="exhausted")], [])


def run_batch(bound: BoundBackend, prefetched: Sequence[Record] | None) -> list[Verdict]:
    """One batch through the backend as a runtime drives it; every handled record succeeds but
    the fresh ones with key b"new", which fail. The copy of offset 1 is consumed twice."""
    batch = [copy(1, 1), copy(2, 1), copy(3, 1), copy(4, 2), copy(5, 2), copy(9, 1), copy(1, 1),
             fresh(50, b"busy"), fresh(51, b"new"), fresh(52, b"new"), fresh(53, b"quiet"),
             fresh(54, None), copy(6, 1, group="other")]
    if prefetched is not None:
        bound.prefetch(prefetched)
    verdicts = []
    for record in batch:
        verdict = bound.admit(record)
        verdicts.append(verdict)
        if verdict is not Verdict.PROCESS:
            continue
        if record.key == b"new":
            bound.failed(record, retry(record), {})
        else:
            bound.succeeded(record)
    return verdicts


EXPECTED = [
    Verdict.PROCESS,  # pending at this attempt
    Verdict.PROCESS,  # in flight at this attempt
    Verdict.DUPLICATE,  # already succeeded
    Verdict.DUPLICATE,  # dead
    Verdict.DUPLICATE,  # the row is at attempt 1, the copy says 2
    Verdict.DUPLICATE,  # no row (purged)
    Verdict.DUPLICATE,  # the same copy again in the batch
    Verdict.PARKED,  # behind a key active in the store
    Verdict.PROCESS,  # fails, so its key is waiting from now on
    Verdict.PARKED,  # behind the one staged earlier in the batch
    Verdict.PROCESS,
    Verdict.PROCESS,
    Verdict.PROCESS,  # another group's copy is not this group's to judge
]


@pytest.mark.parametrize("prefetch", ["all", "some", "none"])
def test_admit_gives_the_same_verdicts_with_a_prefetch(store: RetryStore, prefetch: str) -> None:
    scenario(store)
    bound = StoreBackend(store, ordering=True).bind(GROUP)
    everything = [copy(o, 1) for o in (1, 2, 3, 4, 5, 9)] + [
        fresh(o, k) for o, k in ((50, b"busy"), (51, b"new"), (52, b"new"), (53, b"quiet"))]
    # "some": what admit was not given it still asks of the store; "none": no prefetch at all.
    given = {"all": everything, "some": everything[::2], "none": None}[prefetch]
    assert run_batch(bound, given) == EXPECTED


def test_a_prefetch_lasts_one_batch(store: RetryStore) -> None:
    scenario(store)
    bound = StoreBackend(store, ordering=True).bind(GROUP)
    bound.prefetch([copy(1, 1), fresh(60, b"busy")])
    assert bound.admit(copy(1, 1)) is Verdict.PROCESS
    bound.succeeded(copy(1, 1))
    bound.flush()
    store.cancel(RowFilter(ids=(store.find_record(GROUP, TOPIC, 0, 40).id,)))  # type: ignore[union-attr]
    # The next batch finds the row succeeded and the key quiet, not what the last one read.
    assert bound.admit(copy(1, 1)) is Verdict.DUPLICATE
    assert bound.admit(fresh(60, b"busy")) is Verdict.PROCESS

    bound.prefetch([copy(2, 1)])
    store.write([], [Success(GROUP, TOPIC, 0, 2, 1, None)])
    bound.prefetch([copy(2, 1)])  # a second prefetch reads again
    assert bound.admit(copy(2, 1)) is Verdict.DUPLICATE
    bound.discard()


def admitted(store: RetryStore, bound: BoundBackend, batch: list[Record],
             prefetch: bool) -> tuple[list[Verdict], int]:
    """The verdicts on `batch` (after a prefetch, if asked) and how many statements they took."""
    with statements(store) as seen:
        if prefetch:
            bound.prefetch(batch)
        verdicts = [bound.admit(record) for record in batch]
    return verdicts, len(seen)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prefetched_batch_costs_a_statement_per_chunk_not_per_record(
        store: RetryStore, prefetch: bool) -> None:
    records = 600  # over one LOOKUP_CHUNK
    store.write([entry(GROUP, TOPIC, o, partition=o % 3, key=b"k%d" % o)
                 for o in range(records)], [])
    bound = StoreBackend(store).bind(GROUP)
    batch = [copy(o, 1, partition=o % 3) for o in range(records)]
    # Records are looked up per partition (served by the record index) in chunks of sorted
    # coordinates: partitions 0, 1 and 2 in the first 500, partition 2 in the last 100.
    assert admitted(store, bound, batch, prefetch) == ([Verdict.PROCESS] * records,
                                                      3 + 1 if prefetch else records)

    ordered = StoreBackend(store, ordering=True).bind(GROUP)
    keyed = [fresh(records + o, b"k%d" % o) for o in range(records)]  # the rows' keys
    assert admitted(store, ordered, keyed, prefetch) == ([Verdict.PARKED] * records,
                                                        2 if prefetch else records)


def test_the_consumer_prefetches_every_record_it_admits(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = new_topic(partitions=2), unique_name("prefetched")
    single: list[str] = []  # lookups of one record, which a prefetch makes needless
    find_record, key_active = RetryStore.find_record, RetryStore.key_active

    def one_record(self: RetryStore, *args: Any) -> Any:
        single.append("find_record")
        return find_record(self, *args)

    def one_key(self: RetryStore, *args: Any) -> bool:
        single.append("key_active")
        return key_active(self, *args)

    monkeypatch.setattr(RetryStore, "find_record", one_record)
    monkeypatch.setattr(RetryStore, "key_active", one_key)
    handled: list[tuple[bytes, int]] = []

    def handler(record: Record) -> None:
        handled.append((record.value or b"", record.delivery.attempt))
        if record.delivery.attempt == 0 and record.value != b"v0":
            raise RuntimeError("first delivery fails")

    values = [b"v%d" % i for i in range(8)]
    # Each key lives in one partition: across partitions a batch's order is arbitrary, and a
    # key spread over both could park v0 behind a later record's failure.
    for index, value in enumerate(values):
        produce(bootstrap, topic, [value], key=b"k%d" % (index % 4), partition=index % 2)
    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("100ms")), handler,
                                config=FAST_GROUP,
                                retry_backend=StoreBackend(store, ordering=True))
    runs = [Background(consumer), Background(scheduler(store, bootstrap))]
    try:
        wait_until(lambda: store.counts(RowFilter(group=group)).get(SUCCEEDED, 0) == 7, 60,
                   "every failed record retried")
    finally:
        for run in runs:
            run.stop()
    assert sorted(value for value, attempt in handled if attempt > 0) == values[1:]
    assert single == []  # every admit was answered from the batch's prefetch


def test_a_copy_from_an_earlier_policys_retry_topic_is_handled_not_taken_for_a_duplicate(
        store: RetryStore) -> None:
    """Retry copies left in retry topics when a group moved to the store have no row: they are
    handled as any record, where the store's own copy without a row is a duplicate."""
    bound = StoreBackend(store).bind(GROUP)
    left = Record(f"{TOPIC}.{GROUP}.retry.5s", 0, 3, 1, None, b"v", [("redrive-group", b"g")],
                  Delivery(attempt=1, group=GROUP,
                           original=Origin(TOPIC, 0, 7, 1_700_000_000_000)))
    assert bound.admit(copy(7, 1)) is Verdict.DUPLICATE
    assert bound.admit(left) is Verdict.PROCESS
