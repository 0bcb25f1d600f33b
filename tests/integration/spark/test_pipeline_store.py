"""RetryPipeline with the durable store as its retry backend instead of retry topics."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.spark import RetryPipeline
from redrive.store import RetryStore, Scheduler, StoreBackend

from ..records import produce_input
from .test_pipeline import FORMS, OUTPUT, POLICY, collecting_sink, handle, produce, read_all


@pytest.mark.parametrize("form", FORMS)
def test_failures_wait_in_the_store_and_come_back_through_the_scheduler(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        form: str) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("store")
    sent = produce(bootstrap, topic, ["ok"] * 10 + ["fail1"] * 4 + ["poison"] * 2)
    store = RetryStore(str(tmp_path / "store.db"))
    scheduler = Scheduler(store, bootstrap, idle_s=0.2)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    rows: list[Any] = []
    try:
        def pipeline() -> RetryPipeline:
            return RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS[form],
                                 sink=collecting_sink(rows), checkpoint=str(tmp_path / "cp"),
                                 trigger_interval="300 milliseconds",
                                 retry_backend=StoreBackend(store))

        stats = pipeline().run(until=lambda s: s.finished >= len(sent), timeout_s=120)

        assert Counter(row["attempt"] for row in rows) == {0: 10, 1: 4}
        assert {row["key"] for row in rows} == {k for k, kind in sent.items()
                                                if kind != "poison"}
        assert all(row["late_ms"] >= 0 for row in rows)
        assert stats.early == 0 and stats.skipped == 0
        assert stats.succeeded_by_retries == {0: 10, 1: 4}
        assert stats.retried_by_attempt == {1: 4}
        assert stats.dead_lettered_by_reason == {"not-retryable": 2}
        # With a store the batches also spend time asking it and writing to it.
        assert {"ledger", "admit", "write", "count", "route", "store"} == set(stats.step_seconds)
        assert store.counts() == {"succeeded": 4, "dead": 2}

        # A copy the scheduler published again (it died before marking it) is refused by the
        # store, whose row says it succeeded: skipped, not handled twice.
        again = next(m for m in read_all(bootstrap, topic) if h.last(
            kafka.message_headers(m), h.ATTEMPT) == b"1")
        produce_input(bootstrap, [kafka.OutRecord(
            topic, again.value(), again.key(), kafka.message_headers(again), again.partition())])
        restarted = pipeline()
        stats = restarted.run(until=lambda s: s.skipped >= 1, timeout_s=60)
    finally:
        scheduler.stop()
        thread.join(30)

    assert len(rows) == 14
    assert (stats.records, stats.skipped, stats.finished) == (1, 1, 0)
    assert restarted.metrics.value("redrive_skipped_total", topic=topic, why="duplicate") == 1
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
