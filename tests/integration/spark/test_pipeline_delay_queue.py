"""RetryPipeline with retry_backend=DelayQueue: failures wait in the delay service's shared tiers
and come back to the main topic for this pipeline only, beside a consumer group that reads the
same topic and retries through the same tiers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.backends import DelayQueue
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers, ensure_topics
from redrive.policy import Backoff, RetryPolicy
from redrive.record import ErrorInfo, Record
from redrive.routing import route
from redrive.spark import RetryPipeline
from redrive.spark.ledger import DONE, ROUTING, Entry, append
from redrive.spark.tasks import record_of

from ..background import Background, Runnable
from ..consumer.conftest import FAST_GROUP, Running, wait_until
from ..records import produce_input
from .conftest import query_checkpoint
from .test_dataframe_form import POLICY, transform
from .test_dataframe_form import produce as df_produce
from .test_pipeline import FORMS, collecting_sink, produce, read_all


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


@pytest.mark.parametrize("dies", ["after-copying", "before-copying"])
def test_a_batch_run_again_copies_through_the_tiers_once_and_tells_its_copies_from_others(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, dies: str) -> None:
    """The driver dies after the batch copied its failures to the shared tiers, or after it
    marked the routing but before it copied (while another group copied the same records, at
    the same attempt, to the same tier). Run again, the batch copies each failure once: the
    delay queue's copies went around the batch ledger, and a run again copied them all twice."""
    topic, group = new_topic(), unique_name("dqagain")
    tiers = Tiers.of(("100ms", "1s"), prefix=f"{unique_name('sdq')}.delay")
    ensure_topics(bootstrap, tiers, partitions=1)
    df_produce(bootstrap, topic, ["ok"] * 2 + ["bad"] * 2 + ["flaky"] * 2)
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=transform,
                             sink=str(tmp_path / "out"),
                             checkpoint=query_checkpoint(tmp_path / "cp"),
                             retry_backend=DelayQueue(tiers))
    pipeline.ensure_topics()
    body = pipeline.body()
    frame = spark.read.format("redrive-kafka").options(
        **{"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true",
           "redrive.decodeHeaders": "true", "startingOffsets": "earliest",
           "endingOffsets": "latest"}).load()
    other = DelayQueue(tiers).bind("other-group")
    partitions = kafka.topic_partitions(kafka.admin(bootstrap))
    written = append
    entries: list[str] = []

    def dying(producer: Any, name: str, entry: Entry) -> None:
        entries.append(entry.state)
        if entries.count(DONE) == 1 and entry.state == DONE and dies == "after-copying":
            raise RuntimeError("the driver died after copying")
        written(producer, name, entry)
        if entries == [ROUTING] and dies == "before-copying":
            copies = []
            for row in frame.where("CAST(value AS STRING) LIKE 'flaky%'").collect():
                record = record_of(row.asDict())
                decision = route(record, ErrorInfo("TimeoutError", "slow upstream"), POLICY,
                                 now_ms(), group="other-group")
                copies.append(other.failed(record, decision, partitions))
            produce_input(bootstrap, [c for c in copies if c])
            raise RuntimeError("the driver died before copying")

    monkeypatch.setattr("redrive.spark.ledger.append", dying)
    with pytest.raises(RuntimeError, match="the driver died"):
        body(frame, 0)
    body(frame, 0)

    in_tiers = [m for tier in tiers.topics for m in read_all(bootstrap, tier)]
    by_group = Counter((h.text_of(kafka.message_headers(m), h.GROUP),
                        h.read_delivery(kafka.message_headers(m)).original.offset)  # type: ignore
                       for m in in_tiers)
    others = 2 if dies == "before-copying" else 0
    assert by_group == Counter({(group, 4): 1, (group, 5): 1,
                                **({("other-group", 4): 1, ("other-group", 5): 1}
                                   if others else {})})
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(h.read_delivery(kafka.message_headers(m)).original.offset  # type: ignore
                  for m in dead) == [2, 3]
    assert spark.read.parquet(str(tmp_path / "out")).count() == 2
