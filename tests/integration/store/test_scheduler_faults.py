"""The store's scheduler where a row or the database fails it, on SQLite and PostgreSQL: a
reference whose original topic was deleted dies without stopping the others, and marks whose
writing failed are kept until written, not taken for a dead scheduler's claims."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from redrive import kafka
from redrive.clock import now_ms
from redrive.store import RetryStore, StoreUnavailable
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD, IN_FLIGHT, REFERENCE

from ..consumer.conftest import produce, topic_size, wait_until
from .conftest import entry, scheduler

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]


def test_a_reference_whose_original_topic_was_deleted_dies_and_the_others_go_on(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    """Asking the deleted partition's offsets failed the whole pass, which took the same row
    first again: nothing was published for any group, for good."""
    gone, kept, group = new_topic(), new_topic(), unique_name("gone-original")
    produce(bootstrap, gone, [b"g0"])
    produce(bootstrap, kept, [b"k0"])
    admin = kafka.admin(bootstrap)
    kafka.delete_topics(admin, [gone])
    wait_until(lambda: gone not in kafka.topic_partitions(kafka.admin(bootstrap)), 10,
               "the topic deleted")
    store.write([entry(group, gone, 0, mode=REFERENCE, due_ms=now_ms() - 10),
                 entry(group, kept, 0, mode=REFERENCE, due_ms=now_ms() - 5)], [])
    runner = scheduler(store, bootstrap, timeout_s=5.0)
    try:
        assert runner.run_once().published == 1
    finally:
        runner.close()
    rows = {r.topic: r for r in store.find(RowFilter(group=group))}
    assert (rows[gone].status, rows[gone].reason) == (DEAD, "unknown-topic")
    assert f"topic {gone!r} does not exist" in (rows[gone].error_message or "")
    assert rows[kept].status == IN_FLIGHT
    assert topic_size(bootstrap, kept) == 2  # the record and its copy


def test_marks_whose_writing_failed_are_written_by_the_next_pass_not_reclaimed(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Less than a batch, a pass wrote its marks as it ended; when that failed once (the
    database away a moment) they were dropped, and the published rows, taken for a dead
    scheduler's claims, were published again after the claim time."""
    topic, group = new_topic(), unique_name("settle-fails")
    store.write([entry(group, topic, o, due_ms=now_ms() - 1) for o in range(3)], [])
    runner = scheduler(store, bootstrap, batch_size=10)
    runner.claim_s = 1.0
    settle = RetryStore.settle
    failures = [StoreUnavailable("test", "the database went away")]

    def settle_once_failing(self: RetryStore, batch: Any) -> None:
        if failures:
            raise failures.pop()
        settle(self, batch)

    monkeypatch.setattr(RetryStore, "settle", settle_once_failing)
    try:
        with pytest.raises(StoreUnavailable):
            runner.run_once()
        time.sleep(1.05)
        assert runner.reclaim() == 0
        assert runner.run_once().published == 0
        assert {(r.status, r.dispatches) for r in store.find()} == {(IN_FLIGHT, 1)}
    finally:
        runner.close()
    assert topic_size(bootstrap, topic) == 3


def test_idle_passes_with_a_dead_record_hook_take_no_writing_transaction(
        store: RetryStore, bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        transactions: list[bool]) -> None:
    """With a hook, every pass (every 50 ms when idle) claimed notifications in a writing
    transaction: on SQLite the one write lock the consumers' batches queue on."""
    topic, group = new_topic(), unique_name("idle-hook")
    store.write([entry(group, topic, 0, status=DEAD, reason="exhausted")], [])
    notified: list[int] = []
    runner = scheduler(store, bootstrap, on_dead=[lambda row: notified.append(row.offset)])
    try:
        assert runner.run_once().notified == 1
        assert notified == [0]
        transactions.clear()
        for _ in range(5):
            assert runner.run_once().notified == 0
        assert transactions and not any(transactions)
    finally:
        runner.close()
