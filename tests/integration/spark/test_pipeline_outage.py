"""A RetryPipeline through a broker outage mid-stream, on a broker of the module's own: stopped
with SIGSTOP for a few seconds and continued. The query rides it out without a restart, and every
record ends once: each success written once to the Parquet sink, each poison record
dead-lettered once, each retry copied once, and nothing before its due time.

BROKER_KILL_TESTS=1 adds the broker SIGKILLed and started again on its data dir, which loses the
idempotent producers' state: the batch body's producers fail for good and new ones run the batch
again. It is not in `make test`: whether the kill falls where a producer fails is a matter of
timing. Until 2026-11-26 it wrote two flaky records' retries twice in 3 of 13 runs: noida-db had
lost the batch's routing entry in the ledger and kept the copies written after it. A batch run
again now takes the marks its first attempt took; test_dataframe_form.py shows it with the entry
dropped on purpose. 37 runs since passed, but in the 17 of them that were instrumented the kill
never fell where a producer fails, so those runs do not show the change."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.policy import Backoff, RetryPolicy
from redrive.spark import RetryPipeline, ledger
from redrive.spark.outcomes import DEAD_LETTER, OK, BatchReport, Outcomes, Routed
from redrive.spark.producers import drop_cached_producers

from ..background import Background
from .test_pipeline import FORMS, read_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module", autouse=True)
def no_cached_producer_outlives_the_broker(module_broker: DevBroker) -> Iterator[None]:
    """The driver's cached producers for the module's broker are dropped before it stops: kept,
    they would try to reconnect to its closed port, and log each try, for the rest of the
    session."""
    yield
    drop_cached_producers()

cloudpickle.register_pickle_by_value(sys.modules[__name__])

POLICY = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=ValueError)
OUTAGE_S = 8.0
# noida-db loses what it acknowledged in the last half second or so before a SIGKILL
# (test_broker_outages.py): the records produced before the kill are given this long.
DURABLE_S = 1.5
RECORDS = 240


def kind_of(i: int) -> str:
    return "poison" if i % 20 == 0 else "fail1" if i % 10 == 3 else "ok"


def pipeline_of(form: str, spark: Any, bootstrap: str, topic: str, group: str,
                tmp_path: Path) -> RetryPipeline:
    return RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS[form],
                         sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                         max_offsets_per_trigger=100, trigger_interval="300 milliseconds")


def produce(bootstrap: str, topic: str, numbers: range) -> dict[str, str]:
    sent = {f"k{i}": kind_of(i) for i in numbers}
    kafka.produce_confirmed(kafka.producer(bootstrap), [
        kafka.OutRecord(topic, f"{kind}:{key}".encode(), key.encode())
        for key, kind in sent.items()])
    return sent


def outage(broker: DevBroker, how: str) -> None:
    if how == "kill":
        time.sleep(DURABLE_S)
        broker.kill()
        broker.start(timeout_s=60)
        return
    broker.pause(OUTAGE_S)


@pytest.mark.parametrize("form", ["function", "frame"])
@pytest.mark.parametrize("how", ["stop", "kill"] if os.environ.get("BROKER_KILL_TESTS")
                         else ["stop"])
def test_a_broker_outage_mid_stream_loses_and_repeats_nothing(
        spark: Any, own_broker: DevBroker, unique_name: Any, tmp_path: Path, how: str,
        form: str) -> None:
    bootstrap = own_broker.bootstrap
    topic = unique_name("outage")
    kafka.create_topics(kafka.admin(bootstrap), {topic: 2})
    group = unique_name("outage-g")
    sent = produce(bootstrap, topic, range(RECORDS // 2))
    sink = tmp_path / "out"
    pipeline = pipeline_of(form, spark, bootstrap, topic, group, tmp_path)
    expected_ok = {f"k{i}" for i in range(RECORDS) if kind_of(i) != "poison"}
    running = Background(pipeline)
    try:
        deadline = time.monotonic() + 120
        while pipeline.stats.finished < 50:
            assert running.thread.is_alive(), running.error
            assert time.monotonic() < deadline, f"no progress: {pipeline.stats}"
            time.sleep(0.2)
        outage(own_broker, how)
        sent.update(produce(bootstrap, topic, range(RECORDS // 2, RECORDS)))
        deadline = time.monotonic() + 180
        while pipeline.stats.succeeded < len(expected_ok) \
                or pipeline.stats.dead_lettered < RECORDS // 20:
            assert running.thread.is_alive(), f"the pipeline stopped: {running.error!r}"
            assert time.monotonic() < deadline, f"not finished: {pipeline.stats}"
            time.sleep(0.5)
    finally:
        running.stop(timeout_s=120)

    rows = spark.read.parquet(str(sink)).select("key", "attempt").collect()
    written = Counter(row["key"] for row in rows)
    assert set(written) == expected_ok  # lost 0
    assert max(written.values()) == 1  # 0 rows twice
    flaky = {k for k, kind in sent.items() if kind == "fail1"}
    assert {row["key"] for row in rows if row["attempt"] == 1} == flaky
    dead = Counter(m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.dlt"))
    assert dead == {k: 1 for k, kind in sent.items() if kind == "poison"}
    copies = Counter(m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.retry.1s"))
    assert copies == {k: 1 for k in flaky}
    assert pipeline.stats.early == 0


def test_reports_the_driver_cannot_read_while_the_brokers_are_away_are_counted_after(
        spark: Any, own_broker: DevBroker, unique_name: Any, tmp_path: Path) -> None:
    """The driver counts the batches from the body's reports in the ledger topic. While no broker
    answers, a look fails without stopping run(); the reports are read once the brokers answer,
    each counted once."""
    bootstrap = own_broker.bootstrap
    topic, group = unique_name("reports"), unique_name("reports-g")
    kafka.create_topics(kafka.admin(bootstrap), {topic: 1})
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS["function"],
                             sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"))
    report = BatchReport(7, outcomes=(Outcomes(OK, 0, topic, None, 5),),
                         routes=(Routed(DEAD_LETTER, "not-retryable", 1, f"{topic}.dlt", 2),))
    pipeline.ensure_topics()
    pipeline._follower = ledger.Follower(bootstrap, ledger.ledger_topic(group))
    try:
        ledger.append(kafka.producer(bootstrap), ledger.ledger_topic(group),
                      ledger.Entry(7, ledger.DONE, report={**report.to_dict(),
                                                           "checkpoint": pipeline.checkpoint}))
        pause = threading.Thread(target=own_broker.pause, args=(2 * ledger.LOOK_TIMEOUT_S,))
        pause.start()
        time.sleep(0.2)
        pipeline._read_reports()  # the look times out
        assert pipeline.health.down and pipeline.stats.batches == 0
        pause.join()
        pipeline._read_reports()
        pipeline._read_reports()
    finally:
        pipeline._close_follower()
    assert not pipeline.health.down
    assert (pipeline.stats.batches, pipeline.stats.succeeded, pipeline.stats.dead_lettered) == \
        (1, 5, 2)
    assert pipeline.metrics.value("redrive_processed_total", topic=topic) == 5
