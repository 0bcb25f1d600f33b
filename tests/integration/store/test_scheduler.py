"""The store path end to end on noida-db, on SQLite and PostgreSQL: payload and reference modes,
two schedulers sharing due rows, a scheduler killed before or after publishing, a failed pass,
expired references, and notifications of dead records (a callable and a webhook on a local HTTP
server)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from sqlalchemy import select

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.errors import InvalidArgument
from redrive.kafka.ranges import RangeReadFailed
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, Scheduler, StoreBackend, StoredRetry, StoreUnavailable, claims
from redrive.store.claims import DueBatch
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD, IN_FLIGHT, PENDING, REFERENCE, SUCCEEDED, retries
from redrive.topics import plan

from ..consumer.conftest import FAST_GROUP, produce, read_all, topic_size, wait_until
from .conftest import Background, Calls, Runnable, entry, scheduler

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[Runnable], Background]


class Transient(Exception):
    pass


def failing(calls: Calls, failures: dict[bytes, int]) -> Callable[[Record], None]:
    def handler(record: Record) -> None:
        calls.add(record)
        value = record.value or b""
        if calls.count(value) <= failures.get(value, 0):
            raise Transient(f"attempt {record.delivery.attempt} of {value!r}")
    return handler


@pytest.mark.parametrize("mode", ["payload", REFERENCE])
def test_failures_wait_in_the_store_and_come_back_when_due(
        mode: str, store: RetryStore, bootstrap: str, new_topic: NewTopic,
        unique_name: UniqueName, background: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("store")
    policy = RetryPolicy(backoff=Backoff.sequence("300ms,600ms"))  # 3 attempts
    calls = Calls()
    produce(bootstrap, topic, [b"fine", b"once", b"twice", b"always"], partition=1,
            headers=[("trace-id", b"abc")])
    consumer = RetryingConsumer(bootstrap, topic, group, policy,
                                failing(calls, {b"once": 1, b"twice": 2, b"always": 99}),
                                config=FAST_GROUP,
                                retry_backend=StoreBackend(store, mode=mode))
    running = background(consumer)
    background(scheduler(store, bootstrap))
    wait_until(lambda: store.counts() == {SUCCEEDED: 2, DEAD: 1}, 30, "2 succeeded, 1 dead")
    running.stop()

    assert [calls.count(v) for v in (b"fine", b"once", b"twice", b"always")] == [1, 2, 3, 3]
    for record, at_ms in calls.records():
        assert ("trace-id", b"abc") in record.headers  # the record's own headers came back
        if record.delivery.due_ms is not None:
            assert at_ms >= record.delivery.due_ms  # never early
            assert record.topic == topic and record.partition == 1
            assert record.delivery.group == group
            assert record.delivery.original is not None
            assert record.delivery.original.topic == topic
    dead = store.find(RowFilter(statuses=(DEAD,)))[0]
    assert (dead.attempt, dead.reason, dead.mode) == (3, "exhausted", mode)
    assert dead.error_type is not None and dead.error_type.endswith("Transient")
    assert (dead.value is None) == (mode == REFERENCE)
    # No retry topic was made: the store is the only place records waited.
    assert not any(name in kafka.topic_partitions(kafka.admin(bootstrap))
                   for name in plan(policy, topic, group).retry_topic_names)
    assert consumer.metrics.total("redrive_retried_total") == 5
    assert consumer.metrics.total("redrive_dead_lettered_total") == 1


def test_an_inbox_and_other_groups_reading_the_topic(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        background: Start) -> None:
    topic, group, inbox = new_topic(), unique_name("inboxed"), unique_name("inbox")
    calls, bystander = Calls(), Calls()
    produce(bootstrap, topic, [b"a", b"b"])
    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("200ms")),
                                failing(calls, {b"a": 1}), config=FAST_GROUP,
                                retry_backend=StoreBackend(store, inbox=inbox))
    other = RetryingConsumer(bootstrap, topic, unique_name("bystander"), RetryPolicy(),
                             bystander.add, config=FAST_GROUP)
    runs = [background(consumer), background(other), background(scheduler(store, bootstrap))]
    wait_until(lambda: store.counts() == {SUCCEEDED: 1}, 30, "a retried through the inbox")
    for run in runs[:2]:
        run.stop()
    assert calls.count(b"a") == 2 and calls.count(b"b") == 1
    assert [r.topic for r, _ in calls.records() if r.value == b"a"] == [topic, inbox]
    assert sorted(r.value or b"" for r, _ in bystander.records()) == [b"a", b"b"]
    assert topic_size(bootstrap, topic) == 2


def test_two_schedulers_share_due_rows_and_publish_none_twice(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group, rows = new_topic(partitions=2), unique_name("shared"), 300
    store.write([entry(group, topic, o, partition=o % 2, value=b"%d" % o, due_ms=now_ms() - 1)
                 for o in range(rows)], [])
    schedulers = [scheduler(store, bootstrap, batch_size=20) for _ in range(2)]
    published = [0, 0]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def drain(index: int) -> None:
        start.wait()
        try:
            while (done := schedulers[index].run_once().published) > 0:
                published[index] += done
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for each in schedulers:
        each.close()
    assert errors == []
    assert sum(published) == rows, (published, store.counts())
    copies = read_all(bootstrap, topic, expect=rows, timeout_s=30)
    offsets = [int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies]
    assert sorted(offsets) == list(range(rows))  # every row once, none twice
    if store.url.startswith("postgresql"):
        assert min(published) > 0  # SKIP LOCKED shares the rows; SQLite has one writer at a time
    assert store.counts() == {"in-flight": rows}
    assert all(c.partition == int(c.header(h.ORIGINAL_PARTITION) or -1) for c in copies)


class Crash(BaseException):
    """The scheduler's process dying at this point: nothing after it runs."""


def test_a_scheduler_killed_after_publishing_leaves_claims_whose_copies_are_handled_once(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        background: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group, rows = new_topic(), unique_name("crash"), 5
    produce(bootstrap, topic, [b"r%d" % i for i in range(rows)])
    calls = Calls()
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"))

    def member() -> RetryingConsumer:
        return RetryingConsumer(bootstrap, topic, group, policy,
                                failing(calls, {b"r%d" % i: 1 for i in range(rows)}),
                                config=FAST_GROUP, retry_backend=StoreBackend(store))

    first = background(member())
    wait_until(lambda: store.counts().get(PENDING) == rows, 20, "all stored")
    wait_until(lambda: all(r.due_ms <= now_ms() for r in store.find()), 5, "all due")
    first.stop()

    def killed(self: RetryStore, batch: DueBatch) -> None:
        raise Crash("killed after the broker acknowledged, before the rows were marked")

    with monkeypatch.context() as patch:
        patch.setattr(RetryStore, "settle", killed)
        with pytest.raises(Crash):
            scheduler(store, bootstrap).run_once()
    # Claimed, never marked dispatched: no other pass takes them while the claim lasts.
    assert store.counts() == {IN_FLIGHT: rows}
    assert all(r.dispatched_ms is None for r in store.find())
    assert scheduler(store, bootstrap).run_once().published == 0

    consumer = member()
    running = background(consumer)
    wait_until(lambda: store.counts() == {SUCCEEDED: rows}, 20, "all succeeded")
    running.stop()
    copies = [c for c in read_all(bootstrap, topic) if c.header(h.GROUP) == group]
    offsets = sorted(int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies)
    assert offsets == list(range(rows))  # one copy each
    assert all(calls.count(b"r%d" % i) == 2 for i in range(rows))  # first try + one retry
    assert consumer.metrics.total("redrive_skipped_total") == 0


def test_rows_claimed_by_a_scheduler_killed_before_publishing_come_back_after_the_claim(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group, rows = new_topic(), unique_name("claimed"), 4
    due = now_ms() - 1
    store.write([entry(group, topic, o, value=b"%d" % o, due_ms=due) for o in range(rows)], [])

    def killed(*args: Any, **kwargs: Any) -> None:
        raise Crash("killed before producing")

    with monkeypatch.context() as patch:
        patch.setattr(kafka, "produce_each", killed)
        patch.setattr(RetryStore, "_release_claims", lambda self, ids: None)  # no cleanup either
        with pytest.raises(Crash):
            scheduler(store, bootstrap).run_once()
    assert store.counts() == {IN_FLIGHT: rows}
    restarted = scheduler(store, bootstrap, lease_s=1.0)  # its claims last as long as the lease
    try:
        assert restarted.run_once().published == 0
        assert restarted.reclaim() == 0  # the claim has not run out
        time.sleep(1.05)
        assert restarted.reclaim() == rows
        assert restarted.run_once().published == rows
    finally:
        restarted.close()
    found = store.find()
    assert {(r.status, r.dispatches, r.due_ms) for r in found} == {(IN_FLIGHT, 1, due)}
    copies = read_all(bootstrap, topic, expect=rows, timeout_s=30)
    assert sorted(int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies) == list(range(rows))


def test_a_pass_that_fails_hands_its_claims_back_at_once(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = new_topic(), unique_name("handed-back")
    store.write([entry(group, topic, o, due_ms=now_ms() - 1) for o in range(3)], [])

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))

    with monkeypatch.context() as patch:
        patch.setattr(kafka, "produce_each", unreachable)
        with pytest.raises(KafkaException):
            scheduler(store, bootstrap).run_once()
    assert store.counts() == {PENDING: 3}
    assert scheduler(store, bootstrap).run_once().published == 3


def test_a_whole_batch_is_marked_dispatched_with_the_next_claim(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch, transactions: list[bool]) -> None:
    topic, group = new_topic(), unique_name("deferred")
    store.write([entry(group, topic, o, due_ms=now_ms() - 1) for o in range(5)], [])
    writes = transactions

    def dispatched() -> dict[int, int]:
        return {r.offset: r.dispatches for r in store.find() if r.dispatched_ms is not None}

    runner = scheduler(store, bootstrap, batch_size=2)
    assert runner.run_once().published == 2
    assert dispatched() == {}  # a whole batch: its marks wait for the next claim
    assert store.counts() == {IN_FLIGHT: 2, PENDING: 3}
    writes.clear()
    assert runner.run_once().published == 2
    assert writes == [True]  # one claim that also marks; nothing asked before it
    assert dispatched() == {0: 1, 1: 1}

    def down(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("test", "the database went away")

    # The claim that was to write them fails: its transaction, marks included, is rolled back,
    # and the next pass writes them.
    with monkeypatch.context() as patch:
        patch.setattr(claims, "claim_due", down)
        with pytest.raises(StoreUnavailable):
            runner.run_once()
    assert dispatched() == {0: 1, 1: 1}
    assert runner.run_once().published == 1  # less than a batch: marked at once
    assert dispatched() == {o: 1 for o in range(5)}
    assert store.counts() == {IN_FLIGHT: 5}

    # A whole batch still unmarked when the scheduler closes is marked then.
    store.write([entry(group, topic, o, due_ms=now_ms() - 1) for o in (5, 6)], [])
    assert runner.run_once().published == 2
    assert set(dispatched()) == set(range(5))
    runner.close()
    assert dispatched() == {o: 1 for o in range(7)}
    copies = read_all(bootstrap, topic, expect=7, timeout_s=30)
    assert sorted(int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies) == list(range(7))


def test_a_schedulers_own_unmarked_batch_is_not_taken_for_a_dead_schedulers_claim(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    # Its marks wait for the next claim; a database away for longer than the claim time made
    # the reclaim before that claim hand the published rows back, and the next pass publish
    # them again.
    topic, group = new_topic(), unique_name("own-claim")
    store.write([entry(group, topic, o, due_ms=now_ms() - 1) for o in range(2)], [])
    runner = scheduler(store, bootstrap, batch_size=2)
    runner.claim_s = 1.0  # the database away for longer than this, below
    try:
        assert runner.run_once().published == 2
        time.sleep(1.05)
        assert runner.reclaim() == 0
        assert {(r.status, r.dispatches) for r in store.find()} == {(IN_FLIGHT, 1)}
        assert runner.run_once().published == 0
    finally:
        runner.close()
    assert topic_size(bootstrap, topic) == 2


def test_a_reference_gone_by_retention_dies_as_expired_and_is_notified(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("expired")
    produce(bootstrap, topic, [b"r0", b"r1", b"r2", b"r3"])
    store.write([entry(group, topic, o, mode=REFERENCE, due_ms=now_ms() - 1)
                 for o in range(4)], [])
    admin = kafka.admin(bootstrap)
    for future in admin.delete_records([TopicPartition(topic, 0, 2)]).values():
        future.result(timeout=10)
    dead: list[StoredRetry] = []
    runner = scheduler(store, bootstrap, on_dead=[dead.append])
    done = runner.run_once()
    assert (done.published, done.expired, done.notified) == (2, 2, 2)
    assert runner.metrics.value("redrive_dead_lettered_total", topic=topic,
                                reason="expired") == 2
    rows = {r.offset: r for r in store.find(RowFilter(group=group))}
    assert [rows[o].reason for o in range(4)] == ["expired", "expired", None, None]
    assert [rows[o].status for o in range(4)] == [DEAD, DEAD, "in-flight", "in-flight"]
    assert sorted(r.offset for r in dead) == [0, 1]
    copies = read_all(bootstrap, topic, expect=4)[2:]
    assert [c.value for c in copies] == [b"r2", b"r3"]  # read back from Kafka
    assert [c.header(h.ORIGINAL_OFFSET) for c in copies] == ["2", "3"]
    assert scheduler(store, bootstrap, on_dead=[dead.append]).run_once().notified == 0


@pytest.fixture
def webhook_server() -> Iterator[tuple[str, list[dict[str, Any]], list[int]]]:
    """A local webhook receiver: its URL, the JSON bodies it accepted, and statuses to answer
    with first (500 makes the sender try again later)."""
    received: list[dict[str, Any]] = []
    answers: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = answers.pop(0) if answers else 200
            if status == 200:
                received.append(json.loads(body))
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/dead", received, answers
    finally:
        server.shutdown()
        server.server_close()


def test_every_dead_record_is_notified_once_by_hook_and_webhook(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        webhook_server: tuple[str, list[dict[str, Any]], list[int]]) -> None:
    url, received, answers = webhook_server
    topic, group = new_topic(), unique_name("notify")
    store.write([entry(group, topic, o, status=DEAD, reason="exhausted", key=b"k%d" % o)
                 for o in range(3)] + [entry(group, topic, 9)], [])
    hooked: list[int] = []
    answers.append(500)
    first = scheduler(store, bootstrap, webhook=url, on_dead=[lambda r: hooked.append(r.id)])
    # The webhook failed for the first: it is not notified, and holds back none of the others.
    assert first.run_once().notified == 2
    assert [body["offset"] for body in received] == [1, 2]

    again = scheduler(store, bootstrap, webhook=url, on_dead=[lambda r: hooked.append(r.id)])
    assert again.run_once().notified == 1
    assert again.run_once().notified == 0
    assert sorted(body["offset"] for body in received) == [0, 1, 2]
    assert {body["reason"] for body in received} == {"exhausted"}
    assert received[0]["group"] == group and received[0]["topic"] == topic
    assert len(hooked) == 4 and len(set(hooked)) == 3  # the failed call, then one each

    # A requeued record that dies again is a new death, notified again.
    store.requeue(RowFilter(group=group, statuses=(DEAD,), ids=(hooked[-1],)))
    store.write([entry(group, topic, received[-1]["offset"], status=DEAD, reason="exhausted",
                       attempt=5)], [])
    assert again.run_once().notified == 1
    with pytest.raises(InvalidArgument, match="invalid webhook='ftp://x'"):
        Scheduler(store, bootstrap, webhook="ftp://x")


def test_hooks_run_with_no_lock_held_and_a_dead_notifiers_claim_comes_back(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("notify-lock")
    store.write([entry(group, topic, o, status=DEAD, reason="exhausted") for o in range(2)], [])
    waited: list[float] = []

    def hook(row: StoredRetry) -> None:
        # A runtime's batch written while the hook runs (a slow webhook, say): on SQLite the
        # notifying transaction held the one write lock, and the write failed after its
        # busy timeout.
        started = time.monotonic()
        store.write([entry(group, topic, 100 + row.offset)], [])
        waited.append(time.monotonic() - started)

    runner = scheduler(store, bootstrap, on_dead=[hook])
    runner.claim_s = 1.0
    try:
        assert runner.run_once().notified == 2
        assert len(waited) == 2 and max(waited) < 2.0
        # A scheduler that died while notifying leaves its claim, handed back after the claim.
        store.write([entry(group, topic, 7, status=DEAD, reason="exhausted")], [])
        with store.engine.begin() as conn:
            claimed = claims.take_unnotified(conn, 10, now_ms())
        assert [row.offset for row in claimed.rows] == [7]
        assert runner.run_once().notified == 0
        time.sleep(1.05)
        runner.reclaim()
        assert runner.run_once().notified == 1
        assert runner.run_once().notified == 0
    finally:
        runner.close()
    with store.engine.connect() as conn:
        marks = dict(conn.execute(select(retries.c.offset, retries.c.notified_ms).where(
            retries.c.group_id == group, retries.c.status == DEAD)).all())
    assert set(marks) == {0, 1, 7} and all(mark > 0 for mark in marks.values())


def test_the_oldest_overdue_retry_is_reported(store: RetryStore, bootstrap: str,
                                              new_topic: NewTopic, unique_name: UniqueName,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = new_topic(), unique_name("overdue")
    store.write([entry(group, topic, o, due_ms=now_ms() - 60_000 + o) for o in range(3)], [])
    runner = scheduler(store, bootstrap, batch_size=1)
    asked: list[int | None] = []

    def oldest_pending_due_ms() -> int | None:
        asked.append(found := RetryStore.oldest_pending_due_ms(store))
        return found
    monkeypatch.setattr(store, "oldest_pending_due_ms", oldest_pending_due_ms)
    # Measured as each pass begins: the three rows are ~60 s overdue, and two stay so after it.
    assert runner.run_once().published == 1
    assert 59 <= runner.metrics.value("redrive_oldest_pending_retry_seconds") < 120
    assert runner.run_once().published == 1
    assert runner.run_once().published == 1
    assert 59 <= runner.metrics.value("redrive_oldest_pending_retry_seconds") < 120
    assert runner.run_once().published == 0  # the next pass finds none
    assert runner.metrics.value("redrive_oldest_pending_retry_seconds") == 0
    # Only the first pass asked: each later one followed a whole batch and claimed at once,
    # reading the gauge from what it claimed. After a pass that took less, the next one asks.
    assert len(asked) == 1
    assert runner.run_once().published == 0
    assert asked[1:] == [None]
    runner.close()


def test_a_row_whose_destination_is_gone_dies_without_blocking_the_others(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("nowhere")
    missing = f"{topic}-deleted"
    lost = entry(group, missing, 0, due_ms=now_ms() - 10)
    store.write([lost, entry(group, topic, 1, due_ms=now_ms() - 5)], [])
    runner = scheduler(store, bootstrap)
    done = runner.run_once()
    assert done.published == 1
    rows = {r.topic: r for r in store.find(RowFilter(group=group))}
    assert (rows[missing].status, rows[missing].reason) == (DEAD, "unknown-topic")
    assert missing in (rows[missing].error_message or "")
    assert rows[topic].status == "in-flight"
    assert runner.metrics.value("redrive_dead_lettered_total", topic=missing,
                                reason="unknown-topic") == 1
    runner.close()


def test_a_row_whose_headers_cannot_be_read_dies_naming_them_and_the_others_go_on(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("corrupt")
    store.write([entry(group, topic, o, value=b"v%d" % o, due_ms=now_ms() - 10 + o)
                 for o in range(3)], [])
    with store.engine.begin() as conn:
        conn.execute(retries.update().where(retries.c.group_id == group,
                                            retries.c.offset == 1).values(headers="{broken"))
    dead: list[StoredRetry] = []
    runner = scheduler(store, bootstrap, on_dead=[dead.append])
    try:
        done = runner.run_once()
        assert (done.published, done.died, done.notified) == (2, 1, 1)
        rows = {r.offset: r for r in store.find(RowFilter(group=group))}
        assert [rows[o].status for o in range(3)] == [IN_FLIGHT, DEAD, IN_FLIGHT]
        assert rows[1].reason == "corrupt"
        assert "invalid headers='{broken'" in (rows[1].error_message or "")
        assert rows[1].value == b"v1"  # kept for the operator
        assert [r.offset for r in dead] == [1]
        assert runner.metrics.value("redrive_dead_lettered_total", topic=topic,
                                    reason="corrupt") == 1
        assert runner.run_once().published == 0
    finally:
        runner.close()
    copies = read_all(bootstrap, topic, expect=2)
    assert sorted(c.header(h.ORIGINAL_OFFSET) for c in copies) == ["0", "2"]


def test_a_reference_that_cannot_be_read_back_waits_and_the_other_rows_go_on(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    stuck, topic, group = new_topic(), new_topic(), unique_name("unreadable")
    produce(bootstrap, stuck, [b"s0", b"s1"])
    produce(bootstrap, topic, [b"r0", b"r1"])
    due = now_ms() - 1_000
    store.write([*(entry(group, stuck, o, mode=REFERENCE, due_ms=due) for o in range(2)),
                 *(entry(group, topic, o, mode=REFERENCE, due_ms=due + 1) for o in range(2))],
                [])
    reads: list[int] = []
    read_back = Scheduler._read_back

    def stuck_reads(self: Scheduler, row: StoredRetry) -> Any:
        # As a read that makes no progress ends after timeout_s (or a topic the scheduler
        # may not read).
        if row.topic == stuck and len(reads) < 1:
            reads.append(row.offset)
            raise RangeReadFailed(row.topic, row.partition, row.offset, row.offset + 1,
                                  "stuck at offset 0 for 30s")
        return read_back(self, row)

    monkeypatch.setattr(Scheduler, "_read_back", stuck_reads)
    runner = scheduler(store, bootstrap)
    try:
        started = now_ms()
        assert runner.run_once().published == 2
        assert reads == [0]  # once a pass for the partition: each read may wait timeout_s
        held = store.find(RowFilter(group=group, topic=stuck))
        assert {(r.status, r.dispatches) for r in held} == {(PENDING, 0)}
        # Due again a second after the read failed (reading the other rows took a while).
        assert all(started + 1_000 <= r.due_ms <= now_ms() + 1_000 for r in held)
        assert {r.status for r in store.find(RowFilter(group=group, topic=topic))} == {IN_FLIGHT}
        published = [0]

        def both_published() -> bool:
            published[0] += runner.run_once().published
            return published[0] == 2

        wait_until(both_published, timeout_s=5, what="the held references published")
    finally:
        runner.close()
    copies = read_all(bootstrap, topic, expect=4, timeout_s=30)[2:]
    assert [c.value for c in copies] == [b"r0", b"r1"]
    back = read_all(bootstrap, stuck, expect=4, timeout_s=30)[2:]
    assert [(c.value, c.header(h.ORIGINAL_OFFSET)) for c in back] == [(b"s0", "0"), (b"s1", "1")]


def test_a_refused_copy_waits_with_growing_pauses_and_the_other_rows_go_on(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    # The original fitted its topic; its copy, with redrive's headers, is larger than it takes.
    small = new_topic(config={"max.message.bytes": "20000"})
    topic, group = new_topic(), unique_name("refused")
    due = now_ms() - 1_000
    big = entry(group, small, 0, value=b"x" * 19_800, due_ms=due)
    store.write([big, *(entry(group, topic, o, due_ms=due) for o in range(1, 4))], [])
    runner = scheduler(store, bootstrap)
    try:
        first = runner.run_once()
        assert first.published == 3
        rows = {r.topic: r for r in store.find(RowFilter(group=group, topic=small))}
        held = rows[small]
        assert held.status == PENDING and held.dispatches == 0
        assert now_ms() < held.due_ms <= now_ms() + 1_000  # tried again after a second
        assert runner.run_once().published == 0  # not due again yet: nothing is sent twice
        time.sleep(1.1)
        assert runner.run_once().published == 0  # refused again: two seconds now
        again = store.find(RowFilter(group=group, topic=small))[0]
        assert again.status == PENDING and 1_000 < again.due_ms - now_ms() <= 2_000
    finally:
        runner.close()
    others = store.find(RowFilter(group=group, topic=topic))
    assert {(r.status, r.dispatches) for r in others} == {(IN_FLIGHT, 1)}
    copies = read_all(bootstrap, topic, expect=3, timeout_s=30)
    assert sorted(int(c.header(h.ORIGINAL_OFFSET) or -1) for c in copies) == [1, 2, 3]
    assert topic_size(bootstrap, small) == 0
