"""RetryPipeline with the durable store as its retry backend instead of retry topics."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.spark import RetryPipeline
from redrive.store import RetryStore, Scheduler, StoreBackend

from .test_pipeline import OUTPUT, POLICY, collecting_sink, handle, produce


def test_failures_wait_in_the_store_and_come_back_through_the_scheduler(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("store")
    sent = produce(bootstrap, topic, ["ok"] * 10 + ["fail1"] * 4 + ["poison"] * 2)
    store = RetryStore(str(tmp_path / "store.db"))
    scheduler = Scheduler(store, bootstrap, idle_s=0.2)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    rows: list[Any] = []
    try:
        pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, function=handle,
                                 output_schema=OUTPUT, sink=collecting_sink(rows),
                                 checkpoint=str(tmp_path / "cp"),
                                 trigger_interval="300 milliseconds",
                                 retry_backend=StoreBackend(store))
        stats = pipeline.run(until=lambda s: s.finished >= len(sent), timeout_s=120)
    finally:
        scheduler.stop()
        thread.join(30)

    assert Counter(row["attempt"] for row in rows) == {0: 10, 1: 4}
    assert {row["key"] for row in rows} == {k for k, kind in sent.items() if kind != "poison"}
    assert all(row["late_ms"] >= 0 for row in rows)
    assert stats.early == 0 and stats.skipped == 0
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}
    # With a store the batches also spend time asking it and writing to it.
    assert {"ledger", "admit", "write", "count", "route", "store"} == set(stats.step_seconds)
    assert store.counts() == {"succeeded": 4, "dead": 2}
    on_cluster = kafka.topic_partitions(kafka.admin(bootstrap))
    assert not [name for name in on_cluster if name.startswith(f"{topic}.{group}.")]


def test_per_key_ordering_is_refused_with_a_reason(spark: Any, bootstrap: str,
                                                   tmp_path: Path) -> None:
    store = RetryStore(str(tmp_path / "store.db"))
    with pytest.raises(InvalidArgument, match="retry_backend"):
        RetryPipeline(spark, bootstrap, "orders", "g", POLICY, function=handle,
                      output_schema=OUTPUT, sink="out", checkpoint="cp",
                      retry_backend=StoreBackend(store, ordering=True))
