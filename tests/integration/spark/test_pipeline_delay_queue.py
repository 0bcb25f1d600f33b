"""RetryPipeline with retry_backend=DelayQueue: failures wait in the delay service's shared tiers
and come back to the main topic for this pipeline only, beside a consumer group that reads the
same topic and retries through the same tiers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redrive import kafka
from redrive.backends import DelayQueue
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.spark import RetryPipeline

from ..background import Background, Runnable
from ..consumer.conftest import FAST_GROUP, Running, wait_until
from .test_pipeline import FORMS, collecting_sink, produce


@pytest.mark.parametrize("form", FORMS)
def test_failures_wait_in_the_shared_tiers_and_come_back_for_this_pipeline_only(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        running: Callable[[RetryingConsumer], Running],
        background: Callable[[Runnable], Background], form: str) -> None:
    topic = new_topic(partitions=2)
    tiers = Tiers.of(("100ms", "1s"), prefix=f"{unique_name('sdq')}.delay")
    service = DelayService(bootstrap, tiers, instance_id=unique_name("i"), partitions=2,
                           group_id=unique_name("delay"))
    background(service)
    wait_until(lambda: service.metrics.value("redrive_rebalances_total", kind="assign") >= 1,
               30, "the delay service to own its tiers")
    backend = DelayQueue(tiers)
    # Another group on the same topic fails every "ok" record once: its copies come back to the
    # topic too, and the pipeline must skip them.
    other_calls: Counter[bytes] = Counter()

    def other(record: Record) -> None:
        other_calls[record.key or b""] += 1
        if (record.value or b"").startswith(b"ok") and record.delivery.attempt == 0:
            raise ConnectionError("other group's failure")

    consumer = running(RetryingConsumer(bootstrap, topic, unique_name("other"),
                                        RetryPolicy(backoff=Backoff.fixed("200ms")), other,
                                        config=FAST_GROUP, retry_backend=backend))
    sent = produce(bootstrap, topic, ["ok"] * 8 + ["fail1"] * 4 + ["fail2"] * 2 + ["poison"] * 2)
    group = unique_name("dq-pipeline")
    rows: list[Any] = []
    pipeline = RetryPipeline(spark, bootstrap, topic, group,
                             RetryPolicy(backoff=Backoff.sequence("300ms,300ms"),
                                         not_retryable=ValueError),
                             **FORMS[form], sink=collecting_sink(rows),
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds",
                             retry_backend=backend)
    stats = pipeline.run(until=lambda s: s.finished >= len(sent) and s.skipped >= 8,
                         timeout_s=120)
    wait_until(lambda: sum(other_calls.values()) == len(sent) + 8, 30,
               "the other group to handle its retries")
    consumer.stop()

    assert Counter(row["attempt"] for row in rows) == {0: 8, 1: 4, 2: 2}
    assert {row["key"] for row in rows} == {k for k, kind in sent.items() if kind != "poison"}
    assert all(row["late_ms"] >= 0 for row in rows)
    assert stats.early == 0 and stats.skipped == 8
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}
    assert other_calls == Counter({key.encode(): 2 if kind == "ok" else 1
                                   for key, kind in sent.items()})
    on_cluster = kafka.topic_partitions(kafka.admin(bootstrap))
    assert sorted(name for name in on_cluster if name.startswith(f"{topic}.{group}.")) == \
        [f"{topic}.{group}.dlt"]
    consumer_of_dlt = kafka.consumer(bootstrap)
    try:
        low, high = kafka.watermarks(consumer_of_dlt, f"{topic}.{group}.dlt", 0)
        low1, high1 = kafka.watermarks(consumer_of_dlt, f"{topic}.{group}.dlt", 1)
    finally:
        consumer_of_dlt.close()
    assert (high - low) + (high1 - low1) == 2
    # the copies came back to `topic` through the tiers
    assert service.metrics.total("redrive_forwarded_total") >= 4 + 2 * 2 + 8
