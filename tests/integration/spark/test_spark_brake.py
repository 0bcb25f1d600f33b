"""The dead-letter brake in Spark on noida-db: a batch whose dead letter would pass the limit is
not copied or committed, the stop stands in the control topic, `redrive resume` (or the
cool-off) lets the query go on from its checkpoint, and every record ends once."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark import cloudpickle

from redrive import control
from redrive.cli import cli
from redrive.errors import DeadLetterBrakeTripped
from redrive.policy import DeadLetterLimit, RetryPolicy, error_type
from redrive.spark import RetryPipeline, retry_stream, route_failures, succeeded

from .test_dataframe_form import failure, produce, transform
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def dead_offsets(bootstrap: str, topic: str) -> list[int]:
    return sorted(int(dict(m.headers())["redrive-original-offset"])
                  for m in read_all(bootstrap, topic))


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_the_brake_stops_the_batch_and_resume_lets_it_go_on(
        request: pytest.FixtureRequest, session: str, bootstrap: str, new_topic: Any,
        unique_name: Any, tmp_path: Path) -> None:
    spark = request.getfixturevalue(session)
    topic = new_topic(partitions=1)
    group = unique_name("sbrake")
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, ["ok"] * 3 + ["bad"] * 10 + ["ok"] * 2)  # bad: offsets 3-12
    policy = RetryPolicy(not_retryable=error_type("ParseError"),
                         dead_letter_limit=DeadLetterLimit(consecutive=5))
    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, transform=transform,
                             sink=sink, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds")
    ran: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: ran.update(stats=pipeline.run(
        until=lambda s: s.finished >= 15, timeout_s=240)))
    runner.start()
    try:
        metrics = pipeline.metrics
        wait_until(lambda: metrics.value("redrive_braked_partitions") == 1, 120, "the brake")
        standing = control.standing_stops(bootstrap, group)
        assert [(s.topic, s.partition, s.offset, s.main) for s in standing.active] == \
            [(topic, 0, 8, topic)]  # the sixth dead letter in a row
        assert metrics.value("redrive_brake_trips_total", topic=topic) == 1
        time.sleep(1.0)
        assert read_all(bootstrap, dlt) == []  # nothing of the batch was copied
        assert runner.is_alive() and pipeline.stats.finished == 0

        shown = CliRunner().invoke(cli, ["stats", "-b", bootstrap, "--topic", topic, "--group",
                                         group, "--window", "0"])
        assert shown.exit_code == 0, shown.output
        assert (f"stopped by the dead-letter brake: {topic}[0] at offset 8, " in shown.output
                and f"(more than 5 in a row); the pipeline waits for: redrive resume -b "
                    f"{bootstrap} --group {group} --topic {topic} --partition 0"
                in shown.output)
        typo = CliRunner().invoke(cli, ["resume", "-b", bootstrap, "--group", group + "x"])
        assert typo.exit_code == 2
        assert "no Spark pipeline of it is stopped" in typo.stderr
        resumed = CliRunner().invoke(cli, ["resume", "-b", bootstrap, "--group", group,
                                           "--topic", topic, "--partition", "0"])
        assert resumed.exit_code == 0, resumed.output
    finally:
        runner.join(240)
    stats = ran["stats"]
    # Counted afresh from offset 8: the five dead letters left pass, the last two succeed.
    assert dead_offsets(bootstrap, dlt) == list(range(3, 13))
    rows = spark.read.parquet(sink).collect()
    assert Counter(row["key"] for row in rows) == {f"k{i}": 1 for i in (0, 1, 2, 13, 14)}
    assert stats.dead_lettered_by_reason == {"not-retryable": 10}
    assert stats.succeeded_by_retries == {0: 5}
    assert pipeline.metrics.value("redrive_braked_partitions") == 0
    assert control.standing_stops(bootstrap, group).released == {(topic, 0): 8}


def per_record(record: dict[str, Any]) -> dict[str, Any]:
    if record["value"].startswith(b"bad"):
        raise ValueError("cannot parse")
    return {"key": record["key"].decode()}


def test_a_cool_off_lets_the_pipeline_go_on_by_itself(spark: Any, bootstrap: str,
                                                      new_topic: Any, unique_name: Any,
                                                      tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("scool")
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, ["ok"] + ["bad"] * 4 + ["ok"])  # bad: offsets 1-4
    policy = RetryPolicy(not_retryable=ValueError,
                         dead_letter_limit=DeadLetterLimit(consecutive=2, cool_off="2s"))
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, function=per_record,
                             output_schema="key string", sink=str(tmp_path / "out"),
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds")
    started = time.monotonic()
    stats = pipeline.run(until=lambda s: s.finished >= 6, timeout_s=180)
    assert time.monotonic() - started > 2.0
    assert dead_offsets(bootstrap, dlt) == [1, 2, 3, 4]
    assert stats.dead_lettered_by_reason == {"not-retryable": 4}
    assert stats.succeeded_by_retries == {0: 2}
    assert pipeline.metrics.value("redrive_brake_trips_total", topic=topic) == 1
    assert control.standing_stops(bootstrap, group).released == {(topic, 0): 3}


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_route_failures_fails_the_batch_until_resumed(
        request: pytest.FixtureRequest, session: str, bootstrap: str, new_topic: Any,
        unique_name: Any, tmp_path: Path) -> None:
    """In a user's own foreachBatch (on Spark Connect, run by the server's Python), the brake's
    counts live in that process, its stops in the control topic."""
    spark = request.getfixturevalue(session)
    topic = new_topic(partitions=1)
    group = unique_name("sown")
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, ["bad"] * 6 + ["ok"] * 2)
    policy = RetryPolicy(not_retryable=error_type("ParseError"),
                         dead_letter_limit=DeadLetterLimit(consecutive=3))
    checkpoint = str(tmp_path / "cp")
    out = str(tmp_path / "out")

    def each_batch(batch: Any, batch_id: int) -> None:
        checked = batch.withColumn("error", failure(batch))
        route_failures(checked, bootstrap, group, policy, batch_id=batch_id,
                       checkpoint=checkpoint)
        (checked.where(succeeded(checked)).selectExpr("CAST(key AS STRING) AS key")
         .write.mode("overwrite").parquet(f"{out}/batch={batch_id}"))

    def run_query() -> Any:
        query = (retry_stream(spark, bootstrap, topic, group, policy)
                 .writeStream.foreachBatch(each_batch)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except Exception as exc:  # the query's error: its text names the brake's
            return exc
        return None

    def written() -> Counter[str]:
        return (Counter(row["key"] for row in spark.read.parquet(out).collect())
                if Path(out).exists() else Counter())

    first = run_query()
    assert first is not None and DeadLetterBrakeTripped.__name__ in str(first)
    assert f"stopped {topic}[0] at offset 3" in str(first)
    assert read_all(bootstrap, dlt) == [] and written() == Counter()
    # Started again, it stops at once while the stop stands.
    again = run_query()
    assert again is not None and f"stopped {topic}[0] at offset 3" in str(again)
    assert read_all(bootstrap, dlt) == [] and written() == Counter()
    assert len(control.standing_stops(bootstrap, group).active) == 1

    control.request_resume(bootstrap, control.Resume(group, actor="test"))
    assert run_query() is None
    assert dead_offsets(bootstrap, dlt) == list(range(6))
    assert written() == {"k6": 1, "k7": 1}


def test_a_stop_outlives_the_pipeline_that_tripped(spark: Any, bootstrap: str, new_topic: Any,
                                                   unique_name: Any, tmp_path: Path) -> None:
    """stop() (as SIGTERM) ends a braked run() at once and leaves the stop standing; a pipeline
    started again from the checkpoint waits on it too, until resumed."""
    topic = new_topic(partitions=1)
    group = unique_name("sagain")
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, ["bad"] * 4 + ["ok"])
    policy = RetryPolicy(not_retryable=ValueError,
                         dead_letter_limit=DeadLetterLimit(consecutive=1))

    def pipeline() -> RetryPipeline:
        return RetryPipeline(spark, bootstrap, topic, group, policy, function=per_record,
                             output_schema="key string", sink=str(tmp_path / "out"),
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds")

    first = pipeline()
    ran: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: ran.update(stats=first.run(timeout_s=240)))
    runner.start()
    wait_until(lambda: first.metrics.value("redrive_braked_partitions") == 1, 120, "the brake")
    first.stop()
    runner.join(30)
    assert not runner.is_alive() and ran["stats"].finished == 0
    assert [(s.offset, s.limit) for s in control.standing_stops(bootstrap, group).active] == \
        [(1, "more than 1 in a row")]
    assert read_all(bootstrap, dlt) == []

    second = pipeline()
    runner = threading.Thread(target=lambda: ran.update(stats=second.run(
        until=lambda s: s.finished >= 5, timeout_s=240)))
    runner.start()
    try:
        wait_until(lambda: second.metrics.value("redrive_braked_partitions") == 1, 120,
                   "the stop, read again")
        assert read_all(bootstrap, dlt) == []
        control.request_resume(bootstrap, control.Resume(group, topic, 0, "test"))
        # Afresh from offset 1, one dead letter passes; the next stops the query again.
        wait_until(lambda: [s.offset for s in control.standing_stops(bootstrap, group).active]
                   == [2], 120, "the second stop")
        control.request_resume(bootstrap, control.Resume(group, actor="test"))
        wait_until(lambda: [s.offset for s in control.standing_stops(bootstrap, group).active]
                   == [3], 120, "the third stop")
        control.request_resume(bootstrap, control.Resume(group, actor="test"))
    finally:
        runner.join(240)
    assert dead_offsets(bootstrap, dlt) == [0, 1, 2, 3]
    assert ran["stats"].dead_lettered_by_reason == {"not-retryable": 4}
    assert ran["stats"].succeeded_by_retries == {0: 1}
    assert second.metrics.value("redrive_brake_trips_total", topic=topic) == 3


@pytest.mark.parametrize("form", ["transform", "function"])
def test_counts_carry_on_from_batch_to_batch(spark: Any, bootstrap: str, new_topic: Any,
                                             unique_name: Any, tmp_path: Path,
                                             form: str) -> None:
    """Three batches of three records: three dead letters, three successes (a batch without
    dead letters, counted without their order: observed as the batch is written, or by the
    per-record form's count), three dead letters. The successes end the run of dead letters,
    so the limit of three in a row is never passed."""
    topic = new_topic(partitions=1)
    group = unique_name("scarry")
    dlt = f"{topic}.{group}.dlt"
    produce(bootstrap, topic, ["bad"] * 3 + ["ok"] * 3 + ["bad"] * 3)
    policy = RetryPolicy(not_retryable=error_type("ParseError", ValueError),
                         dead_letter_limit=DeadLetterLimit(consecutive=3))
    shape: dict[str, Any] = ({"transform": transform} if form == "transform" else
                             {"function": per_record, "output_schema": "key string"})
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, **shape,
                             sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds", max_offsets_per_trigger=3)
    stats = pipeline.run(until=lambda s: s.finished >= 9, timeout_s=180)
    assert stats.batches >= 3
    assert dead_offsets(bootstrap, dlt) == [0, 1, 2, 6, 7, 8]
    assert stats.succeeded_by_retries == {0: 3}
    assert pipeline.metrics.value("redrive_brake_trips_total", topic=topic) == 0
    assert control.standing_stops(bootstrap, group).active == ()
    assert pipeline.metrics.value("redrive_batch_step_seconds_count", step="brake") \
        == stats.batches
