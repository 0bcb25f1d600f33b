"""RetryPipeline run as a scheduled job (`available_now=True`): each run reads what its topics
hold and is due at its start, then stops by itself; the next run, from the same checkpoint,
takes the retries that have come due since. On the classic session and on Spark Connect. And
what such jobs meet: a checkpoint deleted and made again, a table sink made by the user."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyspark import cloudpickle

from redrive import headers as h
from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.policy import Backoff, RetryPolicy
from redrive.retention import RetentionTooShort
from redrive.spark import PipelineStats, RetryPipeline, retry_stream

from .test_pipeline import handle_in_sql, produce, read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# One retry, 8 s after the failure: long enough that a run started at once finds it not due.
POLICY = RetryPolicy(backoff=Backoff.sequence("8s"), not_retryable=ValueError)
RUN_LIMIT_S = 120.0


def run_once(spark: Any, bootstrap: str, topic: str, group: str, sink: str,
             checkpoint: str) -> tuple[PipelineStats, float, float]:
    """One scheduled run, as a new job would make it; the wall-clock bounds of the run (ms)."""
    started = time.time() * 1000
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=handle_in_sql,
                             sink=sink, checkpoint=checkpoint, available_now=True)
    clock = time.monotonic()
    stats = pipeline.run(timeout_s=RUN_LIMIT_S)
    assert time.monotonic() - clock < RUN_LIMIT_S, "the run did not stop by itself"
    return stats, started, time.time() * 1000


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    found = kafka.consumer(bootstrap, group).committed(
        [TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    return [tp.offset for tp in found]


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_each_run_reads_what_is_due_at_its_start_and_stops(
        request: Any, session: str, bootstrap: str, new_topic: Any, unique_name: Any,
        tmp_path: Path) -> None:
    spark = request.getfixturevalue(session)
    topic = new_topic(partitions=2)
    group = unique_name("scheduled")
    kinds = ["ok"] * 10 + ["fail1"] * 4 + ["forever"] * 2 + ["poison"]
    sent = produce(bootstrap, topic, kinds)
    sink, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    retry_topic = f"{topic}.{group}.retry.8s"

    first, _, _ = run_once(spark, bootstrap, topic, group, sink, checkpoint)
    assert first.succeeded_by_retries == {0: 10}
    assert first.retried_by_attempt == {1: 6}
    assert first.dead_lettered_by_reason == {"not-retryable": 1}
    # The copies made by this run came after its start: the next run handles them.
    assert first.records == len(kinds)
    # The last batch's end is in the group although no batch was planned after it.
    assert sum(committed(bootstrap, group, topic, 2)) == len(kinds)
    copies = read_all(bootstrap, retry_topic)
    assert len(copies) == 6
    dues = [h.read_delivery(kafka.message_headers(m)).due_ms for m in copies]
    assert all(due is not None for due in dues)
    first_due, last_due = min(d for d in dues if d), max(d for d in dues if d)

    second, started, ended = run_once(spark, bootstrap, topic, group, sink, checkpoint)
    assert second.early == 0
    if ended < first_due:  # nothing was due while it ran
        assert second.records == 0
    elif started > last_due:  # everything was
        assert second.records == 6

    time.sleep(max(0.0, (last_due - time.time() * 1000) / 1000) + 0.5)
    third, _, _ = run_once(spark, bootstrap, topic, group, sink, checkpoint)
    assert second.records + third.records == 6  # each copy handled once, in one run or the other
    assert third.early == 0
    assert (second.succeeded_by_retries + third.succeeded_by_retries) == {1: 4}
    assert (second.dead_lettered_by_reason + third.dead_lettered_by_reason) == {"exhausted": 2}

    rows = spark.read.parquet(sink).collect()
    assert len(rows) == len({row["key"] for row in rows}) == 14
    assert Counter(row["attempt"] for row in rows) == {0: 10, 1: 4}
    assert all(row["late_ms"] >= 0 for row in rows)
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(sent[m.key().decode()] for m in dead) == ["forever", "forever", "poison"]
    assert sum(committed(bootstrap, group, retry_topic, 2)) == 6


def test_running_the_same_pipeline_again_starts_a_new_run(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A job keeping its pipeline between runs: each run() reads what is due at its start. The
    second run() returned at once, the first run's stopped query reused, and its retries were
    never handled."""
    topic, group = new_topic(partitions=1), unique_name("again")
    produce(bootstrap, topic, ["ok"] * 3 + ["fail1"] * 2)
    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=handle_in_sql,
                             sink=sink, checkpoint=str(tmp_path / "cp"), available_now=True)
    first = pipeline.run(timeout_s=RUN_LIMIT_S)
    assert (first.records, first.retried_by_attempt) == (5, {1: 2})
    dues = [h.read_delivery(kafka.message_headers(m)).due_ms
            for m in read_all(bootstrap, f"{topic}.{group}.retry.8s")]
    time.sleep(max(0.0, (max(d or 0 for d in dues) - time.time() * 1000) / 1000) + 0.5)
    second = pipeline.run(timeout_s=RUN_LIMIT_S)
    assert (second.records, second.succeeded_by_retries) == (2, {1: 2})
    assert len(spark.read.parquet(sink).collect()) == 5


def test_available_now_takes_no_interval(spark: Any, bootstrap: str) -> None:
    with pytest.raises(InvalidArgument, match=r"trigger_interval.*available_now"):
        RetryPipeline(spark, bootstrap, "orders", "g", POLICY, transform=handle_in_sql,
                      sink="out", checkpoint="cp", available_now=True,
                      trigger_interval="5 seconds")




def test_a_new_checkpoint_takes_the_retry_topics_where_the_group_stood(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A checkpoint is often deleted and started afresh at the same path (a changed query).
    Its startingOffsets are the user's say over the main topics; the retry topics hold the
    group's own unfinished copies, so they go on where the group stood. Each query is its own:
    its batch 0 is not taken for the earlier query's, in the ledger or in the sink."""
    topic = new_topic(partitions=2)
    group = unique_name("fresh")
    kinds = ["ok"] * 6 + ["fail1"] * 4
    produce(bootstrap, topic, kinds)
    sink, checkpoint = str(tmp_path / "out"), tmp_path / "cp"
    policy = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=ValueError)

    def run(starting: str) -> PipelineStats:
        shutil.rmtree(checkpoint, ignore_errors=True)
        pipeline = RetryPipeline(spark, bootstrap, topic, group, policy,
                                 transform=handle_in_sql, sink=sink, checkpoint=str(checkpoint),
                                 available_now=True, starting_offsets=starting)
        return pipeline.run(timeout_s=RUN_LIMIT_S)

    first = run("earliest")
    assert first.succeeded_by_retries == {0: 6} and first.retried_by_attempt == {1: 4}
    time.sleep(1.5)  # the copies are due
    # From the latest main offsets: the four copies are still handled, and not before due.
    second = run("latest")
    assert second.records == 4
    assert second.succeeded_by_retries == {1: 4} and second.early == 0
    # From earliest: the main topic again, as asked, but no copy a second time.
    third = run("earliest")
    assert third.records == len(kinds)
    assert third.succeeded_by_retries == {0: 6} and third.retried_by_attempt == {1: 4}
    rows = spark.read.parquet(sink).collect()
    assert Counter(row["attempt"] for row in rows) == {0: 12, 1: 4}
    assert len({row["redrive_query"] for row in rows}) == 3


def test_a_new_checkpoint_starts_the_main_topic_at_a_time_or_at_given_offsets(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """starting_offsets as a time (Spark's startingTimestamp) or as Spark's JSON of offsets,
    which names the main topic's partitions only: the retry topics start where the group
    stands whatever it says."""
    topic, group = new_topic(partitions=1), unique_name("since")
    produce(bootstrap, topic, ["ok"] * 4)
    time.sleep(1.1)
    since = datetime.now(UTC)
    time.sleep(0.1)
    produce(bootstrap, topic, ["ok"] * 4, start=4)
    sink, checkpoint = tmp_path / "out", tmp_path / "cp"

    def run(starting: Any) -> list[str]:
        shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.rmtree(sink, ignore_errors=True)
        pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY,
                                 transform=handle_in_sql, sink=str(sink),
                                 checkpoint=str(checkpoint), available_now=True,
                                 starting_offsets=starting)
        pipeline.run(timeout_s=RUN_LIMIT_S)
        return sorted(row["key"] for row in spark.read.parquet(str(sink)).collect())

    assert run(since) == ["k4", "k5", "k6", "k7"]
    assert run(json.dumps({topic: {"0": 2}})) == [f"k{i}" for i in range(2, 8)]
    with pytest.raises(InvalidArgument, match="a datetime must say its time zone"):
        RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=handle_in_sql,
                      sink=str(sink), checkpoint=str(checkpoint), available_now=True,
                      starting_offsets=datetime(2026, 11, 27, 9))


def test_a_retry_topic_that_deletes_copies_before_they_are_due_is_refused_before_a_query(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    topic, group = new_topic(), unique_name("short")
    retry_topic = new_topic(name=f"{topic}.{group}.retry.8s", config={"retention.ms": "8000"})
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=handle_in_sql,
                             sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                             available_now=True)
    with pytest.raises(RetentionTooShort, match=f"{retry_topic!r} has retention.ms=8000"):
        pipeline.run(timeout_s=RUN_LIMIT_S)
    with pytest.raises(RetentionTooShort, match="no longer than the 8s a record waits there"):
        retry_stream(spark, bootstrap, topic, group, POLICY)
    assert not (tmp_path / "cp").exists()  # no query started


def test_copies_deleted_before_a_new_checkpoint_read_them_stop_it_unless_told_to_go_on(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """Retry copies the group had not read, deleted (retention, DeleteRecords) before a new
    checkpoint starts: the query fails naming them, as Spark's failOnDataLoss does, unless the
    pipeline is told fail_on_data_loss=False; then it goes on from what is left."""
    topic = new_topic(partitions=2)
    group = unique_name("deleted")
    produce(bootstrap, topic, ["ok"] * 6 + ["fail1"] * 4)
    sink, checkpoint = str(tmp_path / "out"), tmp_path / "cp"
    retry_topic = f"{topic}.{group}.retry.8s"

    def run(**options: Any) -> PipelineStats:
        shutil.rmtree(checkpoint, ignore_errors=True)
        pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY,
                                 transform=handle_in_sql, sink=sink, checkpoint=str(checkpoint),
                                 available_now=True, **options)
        return pipeline.run(timeout_s=RUN_LIMIT_S)

    first = run()
    assert first.retried_by_attempt == {1: 4}
    assert committed(bootstrap, group, retry_topic, 2) == [0, 0]
    reader = kafka.consumer(bootstrap)
    ends = [kafka.watermarks(reader, retry_topic, p)[1] for p in (0, 1)]
    reader.close()
    assert sum(ends) == 4
    admin = kafka.admin(bootstrap)
    for future in admin.delete_records([TopicPartition(retry_topic, p, end)
                                        for p, end in enumerate(ends)]).values():
        future.result(10)

    with pytest.raises(Exception, match=f"data loss on {retry_topic}") as failed:
        run(starting_offsets="latest")
    assert "the next offset to read is 0 but the partition now holds" in str(failed.value)
    assert "fail_on_data_loss=False" in str(failed.value)

    going_on = run(starting_offsets="latest", fail_on_data_loss=False)
    assert going_on.records == 0
    assert committed(bootstrap, group, retry_topic, 2) == ends


@pytest.mark.parametrize(("session", "made_by"), [("spark", "pipeline"), ("spark", "user"),
                                                  ("spark", "user-reordered"),
                                                  ("connect_spark", "user")])
def test_a_table_sink_keeps_every_batch(request: Any, bootstrap: str, new_topic: Any,
                                        unique_name: Any, tmp_path: Path, session: str,
                                        made_by: str) -> None:
    """A table sink, made by the first batch or by the user beforehand, partitioned by query
    and batch: each batch overwrites its own partition only, whatever the session's
    spark.sql.sources.partitionOverwriteMode (static by default, where an overwrite empties the
    whole table)."""
    spark = request.getfixturevalue(session)
    topic = new_topic(partitions=1)
    group = unique_name("table")
    produce(bootstrap, topic, ["ok"] * 9)
    table = unique_name("sink").replace("-", "_")
    if made_by == "user":
        spark.sql(f"CREATE TABLE {table} (key STRING, attempt INT, late_ms BIGINT, "
                  "topic STRING, partition INT, offset BIGINT, redrive_query STRING, "
                  "redrive_batch INT) USING parquet PARTITIONED BY (redrive_query, redrive_batch)")
    elif made_by == "user-reordered":
        # Columns go by name: by position, offsets would land in `key` and keys fail to cast.
        spark.sql(f"CREATE TABLE {table} (OFFSET BIGINT, partition INT, topic STRING, "
                  "late_ms BIGINT, attempt INT, key STRING, redrive_query STRING, "
                  "redrive_batch INT) USING parquet PARTITIONED BY (redrive_query, redrive_batch)")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=handle_in_sql,
                             sink=table, checkpoint=str(tmp_path / "cp"), available_now=True,
                             max_offsets_per_trigger=3)
    try:
        stats = pipeline.run(timeout_s=RUN_LIMIT_S)
        assert stats.batches == 3 and stats.succeeded == 9
        rows = spark.table(table).collect()
        assert sorted(row["key"] for row in rows) == sorted(f"k{i}" for i in range(9))
        assert sorted(row["redrive_batch"] for row in rows) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        assert sorted((row["key"], row["OFFSET" if made_by == "user-reordered" else "offset"],
                       row["topic"]) for row in rows) == [(f"k{i}", i, topic) for i in range(9)]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
