"""The DataFrame form on real Spark and noida-db: a transform with errors as a column, the
`redrive` columns decoded in SQL, route_failures in a user's own foreachBatch, and a replayed
batch that writes and copies nothing twice."""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from pyspark import cloudpickle
from pyspark.sql.pandas.types import to_arrow_type

from redrive import headers as h
from redrive import kafka
from redrive.backends import DelayQueue
from redrive.delay import Tiers
from redrive.errors import InvalidArgument
from redrive.oversize import MESSAGE_KEPT
from redrive.policy import Backoff, DeadLetterLimit, InPlace, RetryPolicy, error_type
from redrive.record import ErrorInfo
from redrive.routing import route
from redrive.spark import RetryPipeline, poison, query_id, retry_stream, route_failures
from redrive.spark.batches import BatchBody
from redrive.spark.columns import arrow_type, with_redrive_column
from redrive.spark.ledger import DONE, ROUTING, Entry, append, ledger_topic
from redrive.spark.options import HEADERS_TYPE
from redrive.spark.sql import functions
from redrive.spark.tally import BatchTally
from redrive.spark.tasks import record_of

from ..records import produce_input
from ..topic_configs import set_record_limit
from .conftest import query_checkpoint
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

POLICY = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=error_type("ParseError"))


def failure(frame: Any) -> Any:
    """Behaviour spelled in the value: ok, bad (ParseError), flaky (fails its first delivery),
    notype (an error without a type)."""
    F = functions(frame)

    kind = F.split(F.col("value").cast("string"), ":")[0]

    def error(kind_name: str, message: str) -> Any:
        return F.struct(F.lit(kind_name).alias("type"), F.lit(message).alias("message"))

    return (F.when(kind == "bad", error("ParseError", "cannot parse"))
            .when((kind == "flaky") & (F.col("redrive.attempt") < 1),
                  error("TimeoutError", "slow upstream"))
            .when(kind == "notype", error("", "no type")))


def transform(frame: Any) -> Any:
    F = functions(frame)

    return frame.select(F.col("key").cast("string").alias("key"),
                        F.col("redrive.attempt").alias("attempt"), "topic", "partition",
                        "offset", failure(frame).alias("error"))


def produce(bootstrap: str, topic: str, kinds: list[str]) -> dict[str, str]:
    sent = {f"k{i}": kind for i, kind in enumerate(kinds)}
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"{kind}:{key}".encode(), key.encode())
        for key, kind in sent.items()])
    return sent


def test_transform_routes_errors_from_a_column(spark: Any, bootstrap: str, new_topic: Any,
                                               unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("frame")
    kinds = ["ok"] * 20 + ["bad"] * 3 + ["flaky"] * 5 + ["notype"] * 2
    sent = produce(bootstrap, topic, kinds)
    # a record whose redrive header is unreadable never reaches the transform
    produce_input(bootstrap, [kafka.OutRecord(
        topic, b"ok:broken", b"broken", [(h.ATTEMPT, b"two")], 0)])
    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=transform,
                             sink=sink, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds")
    held_before = held_rdds(spark)
    started = time.perf_counter()
    stats = pipeline.run(until=lambda s: s.finished >= len(kinds) + 1, timeout_s=150)
    took = time.perf_counter() - started
    assert held_rdds(spark) == held_before  # each batch released what it held

    # Each batch reported where its time went: the steps of every batch, routing (its few
    # failed rows fetched to the body's process first) in those that had failures, all inside
    # the run's own time.
    assert set(stats.step_seconds) == {"ledger", "write", "count", "fetch", "route"}
    assert all(seconds > 0 for seconds in stats.step_seconds.values())
    assert sum(stats.step_seconds.values()) < took
    step_count = "redrive_batch_step_seconds_count"
    assert pipeline.metrics.value(step_count, step="write") == stats.batches
    assert 1 <= pipeline.metrics.value(step_count, step="route") < stats.batches
    assert pipeline.metrics.value(step_count, step="fetch") \
        == pipeline.metrics.value(step_count, step="route")
    assert pipeline.metrics.value("redrive_batch_step_seconds_sum", step="write") \
        == pytest.approx(stats.step_seconds["write"])

    rows = spark.read.parquet(sink).collect()
    assert len(rows) == len({row["key"] for row in rows}) == 25  # every success once
    assert Counter(row["attempt"] for row in rows) == {0: 20, 1: 5}
    assert "error" not in rows[0].asDict()
    assert stats.succeeded_by_retries == {0: 20, 1: 5}
    assert stats.retried_by_attempt == {1: 5}
    assert stats.dead_lettered_by_reason == {"not-retryable": 3, "malformed": 3}
    assert stats.early == 0 and stats.records == len(kinds) + 1 + 5
    assert pipeline.metrics.value("redrive_processed_total", topic=topic) == 25

    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    reasons = Counter((message.key().decode(),
                       h.last(kafka.message_headers(message), h.REASON)) for message in dead)
    expected = {(key, b"not-retryable") for key, kind in sent.items() if kind == "bad"}
    expected |= {(key, b"malformed") for key, kind in sent.items() if kind == "notype"}
    assert set(reasons) == expected | {("broken", b"malformed")} and max(reasons.values()) == 1
    for message in dead:
        pairs = kafka.message_headers(message)
        if message.key() == b"broken":
            assert (h.PREFIX + "malformed-attempt", b"two") in pairs
        elif sent[message.key().decode()] == "bad":
            assert h.last(pairs, h.ERROR_TYPE) == b"ParseError"
            assert h.last(pairs, h.ERROR_MESSAGE) == b"cannot parse"
    retries = read_all(bootstrap, f"{topic}.{group}.retry.1s")
    assert sorted(m.key().decode() for m in retries) == sorted(
        key for key, kind in sent.items() if kind == "flaky")


def held_rdds(spark: Any) -> set[int]:
    return set(spark.sparkContext._jsc.getPersistentRDDs().keySet())


def test_a_batch_whose_held_rows_are_lost_runs_again_persisted(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A batch is held as a local checkpoint, which Spark cannot compute again if an executor
    holding it is gone. Lost after the sink's write, the batch runs again persisted: every
    failure is routed, once."""
    topic = new_topic(partitions=2)
    group = unique_name("lost")
    sent = produce(bootstrap, topic, ["ok"] * 8 + ["bad"] * 3 + ["flaky"] * 4)
    written: list[tuple[int, int]] = []

    def losing_sink(frame: Any, batch_id: int) -> None:
        written.append((batch_id, frame.count()))
        if len(written) == 1:  # as an executor's loss would: the held blocks go
            for rdd in spark.sparkContext._jsc.getPersistentRDDs().values():
                rdd.unpersist(True)

    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=transform,
                             sink=losing_sink, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds")
    with caplog.at_level("WARNING", logger="redrive.spark"):
        stats = pipeline.run(until=lambda s: s.finished >= len(sent), timeout_s=150)
    assert any("were lost" in record.getMessage() and "runs again, persisted"
               in record.getMessage() for record in caplog.records)
    assert written[0] == written[1]  # the first batch was written twice: lost, then again
    assert stats.retried_by_attempt == {1: 4}
    assert stats.dead_lettered_by_reason == {"not-retryable": 3}
    assert stats.succeeded_by_retries == {0: 8, 1: 4}
    retries = read_all(bootstrap, f"{topic}.{group}.retry.1s")
    assert sorted(m.key().decode() for m in retries) == sorted(
        key for key, kind in sent.items() if kind == "flaky")
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(m.key().decode() for m in dead) == sorted(
        key for key, kind in sent.items() if kind == "bad")


def test_a_transform_whose_errors_differ_each_time_loses_nothing(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A transform need not give the same errors when computed again (a service's answer, a
    random sample): routing copies exactly the rows the sink's write left out."""
    topic = new_topic(partitions=2)
    group = unique_name("coin")
    sent = produce(bootstrap, topic, ["ok"] * 60)

    def coin(frame: Any) -> Any:
        F = functions(frame)
        error = F.when(F.rand() < 0.5, F.struct(F.lit("Flaky").alias("type"),
                                                F.lit("heads").alias("message")))
        return frame.select(F.col("key").cast("string").alias("key"), "topic", "partition",
                            "offset", error.alias("error"))

    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group,
                             RetryPolicy(backoff=Backoff.sequence("1h")), transform=coin,
                             sink=sink, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds")
    stats = pipeline.run(until=lambda s: s.records >= len(sent), timeout_s=150)
    written = [row["key"] for row in spark.read.parquet(sink).collect()]
    retried = [m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.retry.1h")]
    assert 0 < len(retried) < len(sent)
    assert sorted(written + retried) == sorted(sent)  # each record written or copied, once
    assert stats.retried == len(retried) and stats.succeeded == len(written)


def lines(frame: Any, all_or_none: bool) -> Any:
    """A record's value is a list of lines ("a,bad,b:key"), each a row; a "bad" line fails the
    record's first delivery. With `all_or_none`, every line of a failed record carries its error.
    """
    from pyspark.sql import Window

    F = functions(frame)
    listed = F.split(F.split(F.col("value").cast("string"), ":")[0], ",")
    rows = frame.select("topic", "partition", "offset", F.col("key").cast("string").alias("key"),
                        F.col("redrive.attempt").alias("attempt"), F.explode(listed).alias("line"))
    error = F.when((F.col("line") == "bad") & (F.col("attempt") < 1),
                   F.struct(F.lit("TimeoutError").alias("type"),
                            F.concat(F.lit("line "), F.col("line")).alias("message")))
    if all_or_none:
        error = F.first(error, ignorenulls=True).over(
            Window.partitionBy("topic", "partition", "offset"))
    return rows.withColumn("error", error)


@pytest.mark.parametrize("all_or_none", [False, True])
def test_a_record_with_several_failed_rows_is_copied_once(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        all_or_none: bool) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("lines")
    produce(bootstrap, topic, ["a,b,c", "a,bad,bad", "bad,b"])
    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY,
                             transform=partial(lines, all_or_none=all_or_none), sink=sink,
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds")
    stats = pipeline.run(until=lambda s: s.finished >= 3, timeout_s=90)

    copies = [m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.retry.1s")]
    assert sorted(copies) == ["k1", "k2"]  # k1 failed two rows: one copy
    assert stats.retried_by_attempt == {1: 2}
    assert stats.succeeded_by_retries == {0: 1, 1: 2}
    written = Counter((row["key"], row["line"], row["attempt"])
                      for row in spark.read.parquet(sink).collect())
    retried = Counter({("k1", "a", 1): 1, ("k1", "bad", 1): 2, ("k2", "bad", 1): 1,
                       ("k2", "b", 1): 1})
    first_try = Counter({("k0", "a", 0): 1, ("k0", "b", 0): 1, ("k0", "c", 0): 1})
    if not all_or_none:  # a failed record's good rows are written at each try
        first_try.update({("k1", "a", 0): 1, ("k2", "b", 0): 1})
    assert written == first_try + retried


def amounts(frame: Any) -> Any:
    """Spark itself fails on some values: 'abc' cast to int (ANSI mode), 'boom' in a Python UDF.
    A negative amount is an expected failure, returned in the error column."""
    from pyspark.sql.types import StringType

    F = functions(frame)

    def checked(value: str) -> str:
        if value == "boom":
            raise ValueError(f"cannot check {value}")
        return value

    # A lambda: the type hints of `checked` would make Spark guess at a pandas UDF. A type,
    # not DDL: a Connect client parses DDL with a classic session's parser.
    text = F.udf(lambda value: checked(value), StringType())(F.col("value").cast("string"))
    amount = text.cast("int")
    error = F.when(amount < 0, F.struct(F.lit("NegativeAmount").alias("type"),
                                        F.lit("below zero").alias("message")))
    return frame.select("topic", "partition", "offset", amount.alias("amount"),
                        F.col("redrive.attempt").alias("attempt"), error.alias("error"))


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    produce_input(bootstrap, [
        kafka.OutRecord(topic, value.encode(), value.encode()) for value in values])


def test_records_the_transform_cannot_compute_are_routed_not_fatal(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """Without this, one such record fails the job, stops the query, and stops it again at
    every restart: its partition is blocked for good."""
    topic = new_topic(partitions=2)
    group = unique_name("unfit")
    values = ["1", "2", "abc", "3", "boom", "4", "-5", "6"]
    produce_values(bootstrap, topic, values)
    policy = RetryPolicy(backoff=Backoff.sequence("1s"),
                         not_retryable=error_type("CAST_INVALID_INPUT", ValueError))
    sink = str(tmp_path / "out")
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, transform=amounts,
                             sink=sink, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds")
    stats = pipeline.run(until=lambda s: s.finished >= len(values), timeout_s=150)

    written = Counter(row["amount"] for row in spark.read.parquet(sink).collect())
    assert written == {1: 1, 2: 1, 3: 1, 4: 1, 6: 1}
    assert stats.succeeded == 5 and stats.retried_by_attempt == {1: 1}
    assert stats.dead_lettered_by_reason == {"not-retryable": 2, "exhausted": 1}
    assert stats.step_seconds["isolate"] > 0
    dead = {m.value().decode(): kafka.message_headers(m)
            for m in read_all(bootstrap, f"{topic}.{group}.dlt")}
    assert set(dead) == {"abc", "boom", "-5"}
    assert h.last(dead["abc"], h.ERROR_TYPE) == b"CAST_INVALID_INPUT"
    assert b"'abc'" in (h.last(dead["abc"], h.ERROR_MESSAGE) or b"")
    assert h.last(dead["boom"], h.ERROR_TYPE) == b"ValueError"
    assert h.last(dead["boom"], h.ERROR_MESSAGE) == b"cannot check boom"
    assert h.last(dead["-5"], h.REASON) == b"exhausted"
    assert [m.value() for m in read_all(bootstrap, f"{topic}.{group}.retry.1s")] == [b"-5"]


def test_a_write_that_fails_by_itself_is_not_blamed_on_records(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic()
    group = unique_name("sinkdown")
    produce_values(bootstrap, topic, ["1", "2"])

    def down(frame: Any, batch_id: int) -> None:
        raise OSError("the sink is down")

    def run(values: list[str], sink: Any) -> Any:
        produce_values(bootstrap, topic, values)
        return RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=amounts,
                             sink=sink, checkpoint=str(tmp_path / unique_name("cp")),
                             trigger_interval="300 milliseconds").run(timeout_s=60)

    with pytest.raises(Exception, match="the sink is down"):
        run([], down)
    # and more unfit records than a batch isolates is a transform to fix: the batch fails
    monkeypatch.setattr(poison, "MAX_RECORDS", 1)
    with pytest.raises(Exception, match="more than 1 records of the batch fail the transform"):
        run(["abc", "xyz"], str(tmp_path / "out"))
    # an error every record meets ends the search after a few levels, not a search per record:
    # 2 failing parts of the range, then 4, more than 2
    monkeypatch.setattr(poison, "MAX_RECORDS", 2)
    with pytest.raises(Exception, match=r"found after (\d+) Spark jobs") as failed:
        run(["boom"] * 40, str(tmp_path / "out"))
    jobs = re.search(r"found after (\d+) Spark jobs", str(failed.value))
    assert jobs is not None and int(jobs.group(1)) <= 2 + 1 + 2 + 4
    # nothing was routed
    destinations = [name for name in kafka.topic_partitions(kafka.admin(bootstrap))
                    if name.startswith(f"{topic}.{group}.")]
    assert len(destinations) == 2
    assert [read_all(bootstrap, name) for name in destinations] == [[], []]


def test_transform_is_checked_before_starting(spark: Any, bootstrap: str, new_topic: Any,
                                              unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic()

    def pipeline(function: Any, policy: RetryPolicy = POLICY) -> RetryPipeline:
        return RetryPipeline(spark, bootstrap, topic, unique_name("check"), policy,
                             transform=function, sink=str(tmp_path / "out"),
                             checkpoint=str(tmp_path / unique_name("cp")))

    with pytest.raises(InvalidArgument, match=r"error_column=.*'error'.*no such column"):
        pipeline(lambda frame: frame.select("key")).start()
    with pytest.raises(InvalidArgument, match=r"error string.*struct<type: string"):
        pipeline(lambda frame: frame.selectExpr("key", "'x' AS error")).start()
    # without the record's identity a failed row could not be routed: found at start, not at
    # the first batch with a failure
    with pytest.raises(InvalidArgument, match=r"columns='offset'.*keep them in the transform"):
        pipeline(lambda frame: transform(frame).drop("offset")).start()
    in_place = RetryPolicy(in_place=InPlace(on=TimeoutError, retries=1))
    with pytest.raises(InvalidArgument, match=r"policy.in_place"):
        pipeline(transform, in_place)
    # The brake judges the copies to retry topics (test_spark_brake.py), not a backend's.
    braked = RetryPolicy(dead_letter_limit=DeadLetterLimit(consecutive=10))
    with pytest.raises(InvalidArgument, match=r"policy.dead_letter_limit=.*not with DelayQueue"):
        RetryPipeline(spark, bootstrap, topic, unique_name("check"), braked, transform=transform,
                      sink=str(tmp_path / "out"), checkpoint=str(tmp_path / unique_name("cp")),
                      retry_backend=DelayQueue(Tiers.of(("1s",))))


def test_route_failures_in_a_users_own_foreach_batch(spark: Any, bootstrap: str,
                                                     new_topic: Any, unique_name: Any,
                                                     tmp_path: Path) -> None:
    topic = new_topic()
    group = unique_name("own")
    produce(bootstrap, topic, ["ok"] * 6 + ["bad"] * 2 + ["flaky"] * 3)
    totals: Counter[str] = Counter()

    def each_batch(batch: Any, batch_id: int) -> None:
        counts = route_failures(batch.withColumn("error", failure(batch)), bootstrap, group,
                                POLICY)
        totals["retried"] += counts.retried
        totals["dead"] += counts.dead_lettered
        totals["seen"] += batch.count()

    frame = retry_stream(spark, bootstrap, topic, group, POLICY)
    assert "redrive" in frame.columns
    query = (frame.writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert totals == {"retried": 3, "dead": 2, "seen": 11}
    assert len(read_all(bootstrap, f"{topic}.{group}.retry.1s")) == 3
    assert len(read_all(bootstrap, f"{topic}.{group}.dlt")) == 2


def test_route_failures_from_a_narrow_output_dead_letters_unreadable_headers_once(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    # The output keeps only the records' identity and errors, as after a select or a join:
    # the batch given as `source=` still says which records' redrive headers are unreadable.
    from redrive.spark.stream import Subscription

    topic, group = new_topic(), unique_name("narrow")
    Subscription(bootstrap, topic, group, POLICY).ensure_topics()
    unreadable = [(h.ATTEMPT, b"abc")]
    produce_input(bootstrap, [
        kafka.OutRecord(topic, b"ok:k0", b"k0"),
        kafka.OutRecord(topic, b"ok:k1", b"k1", unreadable),
        kafka.OutRecord(topic, b"bad:k2", b"k2", unreadable),
        kafka.OutRecord(topic, b"bad:k3", b"k3")])
    batch = (spark.read.format("redrive-kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("includeHeaders", "true").option("redrive.decodeHeaders", "true").load())
    narrow = batch.select("topic", "partition", "offset", failure(batch).alias("error"))
    counts = route_failures(narrow, bootstrap, group, POLICY, source=batch)
    assert sorted((r.reason, r.n) for r in counts) == [("malformed", 2), ("not-retryable", 1)]
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted((m.key(), h.last(kafka.message_headers(m), h.REASON)) for m in dead) == [
        (b"k1", b"malformed"), (b"k2", b"malformed"), (b"k3", b"not-retryable")]


def test_route_failures_cuts_the_error_text_of_a_copy_over_the_producers_limit(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A failed record that fits its producer only without its error text is copied with that
    text cut, its value whole; the other failures keep theirs."""
    topic = new_topic()
    group = unique_name("large")
    limit = 50_000  # redrive's producer's message.max.bytes in this test
    big = b"bad:" + b"v" * (limit - 1000)
    produce_input(bootstrap, [
        kafka.OutRecord(topic, b"bad:small", b"k0"), kafka.OutRecord(topic, big, b"k1"),
        kafka.OutRecord(topic, b"ok:2", b"k2")])
    long_message = "cannot parse: " + "x" * 900
    counted: Counter[str] = Counter()

    def each_batch(batch: Any, batch_id: int) -> None:
        F = functions(batch)
        error = F.when(F.col("value").cast("string").startswith("bad"), F.struct(
            F.lit("ParseError").alias("type"), F.lit(long_message).alias("message")))
        counts = route_failures(batch.withColumn("error", error),
                                {"bootstrap.servers": bootstrap, "message.max.bytes": limit},
                                group, POLICY)
        counted["dead"] += counts.dead_lettered
        counted["retried"] += counts.retried

    query = (retry_stream(spark, bootstrap, topic, group, POLICY).writeStream
             .foreachBatch(each_batch).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert counted == {"dead": 2, "retried": 0}
    dead = {message.key(): message for message in read_all(bootstrap, f"{topic}.{group}.dlt")}
    assert set(dead) == {b"k0", b"k1"}
    small, cut = (dict(dead[key].headers()) for key in (b"k0", b"k1"))
    assert dead[b"k1"].value() == big
    assert small[h.ERROR_MESSAGE].decode() == long_message
    assert cut[h.ERROR_MESSAGE].decode().startswith("cannot parse: xxx")
    assert len(cut[h.ERROR_MESSAGE]) <= MESSAGE_KEPT
    assert (cut[h.ERROR_TYPE], cut[h.REASON], cut[h.ORIGINAL_OFFSET]) == \
        (b"ParseError", b"not-retryable", b"1")


def test_a_copy_the_dead_letter_topic_refuses_fails_the_batch_naming_it_and_loses_nothing(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """The source topic takes 2 MB records, its dead-letter topic (made before) 1 MB: the batch
    fails naming the topic and the setting; raised, the query goes on from its checkpoint."""
    topic = new_topic(config={"max.message.bytes": "2000000"})
    group = unique_name("large")
    dlt = new_topic(name=f"{topic}.{group}.dlt")
    connection = {"bootstrap.servers": bootstrap, "message.max.bytes": 3_000_000}
    kafka.produce_confirmed(kafka.producer(connection), [
        kafka.OutRecord(topic, b"bad:" + b"v" * 1_200_000, b"k0"),
        kafka.OutRecord(topic, b"ok:1", b"k1")])

    def each_batch(batch: Any, batch_id: int) -> None:
        route_failures(batch.withColumn("error", failure(batch)), connection, group, POLICY)

    def run() -> Any:
        query = (retry_stream(spark, bootstrap, topic, group, POLICY).writeStream
                 .foreachBatch(each_batch).option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except Exception as exc:  # the batch's error, as Spark raises it
            return exc
        return None

    error = run()
    assert error is not None
    assert f"delivery to {dlt}" in str(error) and "max.message.bytes" in str(error)
    assert read_all(bootstrap, dlt) == []
    set_record_limit(bootstrap, dlt, 2_000_000)
    assert run() is None
    dead = read_all(bootstrap, dlt)
    assert [(m.key(), len(m.value())) for m in dead] == [(b"k0", 1_200_004)]


def test_route_failures_with_the_batch_id_copies_nothing_twice_when_a_batch_runs_again(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """A user's foreachBatch routes, then its own write fails: Spark runs the batch again at the
    restart, and with the batch id route_failures copies none of its failures a second time."""
    topic = new_topic()
    group = unique_name("own")
    produce(bootstrap, topic, ["ok"] * 6 + ["bad"] * 2 + ["flaky"] * 3)
    written: dict[int, list[str]] = {}  # the user's sink, overwritten by batch id
    sink_down = [True]
    counted: Counter[str] = Counter()
    cp = str(tmp_path / "cp")

    def each_batch(batch: Any, batch_id: int) -> None:
        checked = batch.withColumn("error", failure(batch))
        counts = route_failures(checked, bootstrap, group, POLICY, batch_id=batch_id,
                                checkpoint=cp)
        counted["retried"] += counts.retried
        counted["dead"] += counts.dead_lettered
        if sink_down[0]:
            sink_down[0] = False
            raise OSError("sink down")
        written[batch_id] = [row.key.decode() for row in
                             checked.where("error IS NULL").select("key").collect()]

    runs = 0
    while sum(map(len, written.values())) < 9 and runs < 6:
        runs += 1
        query = (retry_stream(spark, bootstrap, topic, group, POLICY).writeStream
                 .foreachBatch(each_batch).option("checkpointLocation", cp)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except Exception as exc:  # the first run's failed write
            assert runs == 1 and "sink down" in str(exc), exc
        time.sleep(0.5)  # the flaky records' retries fall due after 1 s
    keys = Counter(key for rows in written.values() for key in rows)
    assert sorted(keys) == sorted(f"k{i}" for i in [*range(6), 8, 9, 10])
    assert set(keys.values()) == {1}
    # Routed twice (the batch ran twice), copied once.
    assert counted == {"retried": 6, "dead": 4}
    retries = read_all(bootstrap, f"{topic}.{group}.retry.1s")
    assert sorted(m.key().decode() for m in retries) == ["k10", "k8", "k9"]
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(m.key().decode() for m in dead) == ["k6", "k7"]
    entries = [Entry.decode(m.value()) for m in read_all(bootstrap, ledger_topic(group))]
    # Another query's batch 0 (a new checkpoint) is not taken for this one's run again.
    assert [(e.batch, e.state, e.report) for e in entries][:1] == [
        (0, ROUTING, {"by": "route_failures", "checkpoint": cp,
                      "query": query_id(spark, cp)})]
    assert {tuple(mark.rpartition(":")[::2]) for mark in entries[0].marks} == {
        (f"{topic}.{group}.retry.1s", "0"), (f"{topic}.{group}.dlt", "0")}


def test_a_query_reads_its_id_from_its_checkpoint_once(spark: Any, tmp_path: Path) -> None:
    """On the classic session a query's first call reads the checkpoint's metadata (a Spark job,
    once a micro-batch with route_failures); its later calls take the id from the query's own
    thread. A query made afresh at the same path reads it again."""
    source = tmp_path / "in"
    source.mkdir()
    for n in range(3):
        (source / f"{n}.txt").write_text(f"line {n}\n")
    cp = str(tmp_path / "cp")
    seen: list[tuple[int, str]] = []

    def each_batch(batch: Any, batch_id: int) -> None:
        seen.append((batch_id, query_id(batch.sparkSession, cp)))
        # Read again, the file would now name another query (its checksum file goes with it).
        (Path(cp) / "metadata").write_text('{"id": "not-this-query"}')
        (Path(cp) / ".metadata.crc").unlink(missing_ok=True)

    def run() -> str:
        query = (spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
                 .writeStream.foreachBatch(each_batch).option("checkpointLocation", cp)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return str(query.id)

    first = run()
    assert seen == [(0, first), (1, first), (2, first)]
    shutil.rmtree(cp)
    seen.clear()
    second = run()
    assert second != first
    assert seen == [(0, second), (1, second), (2, second)]


def test_route_failures_refuses_a_batch_id_that_is_not_one(spark: Any, bootstrap: str) -> None:
    frame = spark.range(1).selectExpr("CAST(NULL AS STRUCT<type: STRING, message: STRING>) "
                                      "AS error")
    for wrong in (-1, "3", True):
        with pytest.raises(InvalidArgument, match=rf"batch_id={wrong!r}"):
            route_failures(frame, bootstrap, "g", POLICY, batch_id=wrong,  # type: ignore[arg-type]
                           checkpoint="cp")
    for alone in ({"batch_id": 3}, {"checkpoint": "cp"}, {"batch_id": 3, "checkpoint": ""}):
        with pytest.raises(InvalidArgument, match=r"give batch_id and checkpoint .* together"):
            route_failures(frame, bootstrap, "g", POLICY, **alone)  # type: ignore[arg-type]
    # A path that is no query's checkpoint would name no query: each batch 0 would look new.
    with pytest.raises(InvalidArgument, match=r"checkpoint='/no/such/cp': holds no streaming "
                       "query's metadata"):
        route_failures(frame, bootstrap, "g", POLICY, batch_id=0, checkpoint="/no/such/cp")


def decoded_frame(spark: Any, rows: list[tuple[str, list[tuple[str, bytes]], str]]) -> Any:
    """A DataFrame of (topic, headers, value) rows with the `redrive` column, decoded as the
    source's reader decodes it."""
    headers = pa.array([[{"key": k, "value": v} for k, v in pairs] for _, pairs, _ in rows],
                       to_arrow_type(HEADERS_TYPE))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([topic for topic, _, _ in rows]), headers,
         pa.array([value for _, _, value in rows])], names=["topic", "headers", "value"])
    return spark.createDataFrame(pa.Table.from_batches([with_redrive_column(batch,
                                                                            arrow_type())]))


def test_the_tally_is_observed_as_the_batch_is_written(spark: Any) -> None:
    """The tally counted as the sink writes the batch agrees with the one counted by a job of
    its own, on every kind of row; with a sink that runs no action it is counted by the job."""
    now = 1_800_000_000_000
    copy = [(h.GROUP, b"g")]
    rows = [
        *[("main", [], f"ok:{i}") for i in range(5)],
        *[("other", [], f"bad:{i}") for i in range(3)],  # plain rows of a second topic
        ("main.g.retry.1s", [*copy, (h.ATTEMPT, b"1"), (h.DUE, str(now - 1500).encode())], "ok"),
        ("main.g.retry.1s", [*copy, (h.ATTEMPT, b"1"), (h.DUE, str(now + 60_000).encode())],
         "bad"),  # early
        ("main.g.retry.1s", [*copy, (h.ATTEMPT, b"2"), (h.DUE, str(now - 500).encode())], "ok"),
        ("main", [(h.GROUP, b"another"), (h.ATTEMPT, b"1")], "ok"),  # another group's copy
        ("main", [(h.ATTEMPT, b"x")], "ok"),  # malformed
    ]
    topics = ("main", "other", "main.g.retry.1s")

    def tallied(sink_runs: bool, reading: tuple[str, ...] = topics) -> tuple[Any, Any]:
        frame = decoded_frame(spark, rows).repartition(2)
        tally = BatchTally(frame, "g", reading, now)
        frame = tally.observe_batch(frame).persist()
        F = functions(frame)
        output = tally.observe_output(frame.where(tally.mine & ~tally.malformed).select(
            "value", F.when(F.col("value").startswith("bad"), F.struct(
                F.lit("E").alias("type"), F.lit("m").alias("message"))).alias("error")),
            "error").persist()
        if sink_runs:
            output.where("error IS NULL").write.format("noop").mode("append").save()
        try:
            return (tally.result(frame, output, "error"),
                    tally.counted_by_job(frame, output, "error"))
        finally:
            output.unpersist()
            frame.unpersist()

    def classes(tally: Any) -> dict[tuple[str, int, str], tuple[int, int]]:
        """(status, attempt, topic) -> (rows, of them early)"""
        return {(r["status"], r["attempt"], r["topic"]): (r["n"], r["early"])
                for r in tally.counted}

    observed, by_job = tallied(sink_runs=True)
    assert observed.observed and not by_job.observed
    assert classes(observed) == classes(by_job) == {
        ("ok", 0, "main"): (5, 0), ("ok", 0, "other"): (3, 0),
        ("ok", 1, "main.g.retry.1s"): (2, 1), ("ok", 2, "main.g.retry.1s"): (1, 0),
        ("skipped", 1, "main"): (1, 0), ("failed", 0, "main"): (1, 0)}
    assert observed.failed == by_job.failed == 4  # three plain "bad" rows and the early copy
    assert sorted(observed.late_s) == sorted(by_job.late_s) == [-60.0, 0.5, 1.5]

    unwritten, _ = tallied(sink_runs=False)
    assert not unwritten.observed and classes(unwritten) == classes(by_job)
    elsewhere, _ = tallied(sink_runs=True, reading=("main", "other"))
    assert not elsewhere.observed and classes(elsewhere) == classes(by_job)


def four_ok_three_bad(spark: Any, bootstrap: str, topic: str, group: str,
                      tmp_path: Path) -> tuple[BatchBody, Any]:
    """A DataFrame-form pipeline's body, its topics made, and its batch: four good records,
    then three the transform fails as not retryable (offsets 4-6)."""
    produce(bootstrap, topic, ["ok"] * 4 + ["bad"] * 3)
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, transform=transform,
                             sink=str(tmp_path / "out"),
                             checkpoint=query_checkpoint(tmp_path / "cp"))
    pipeline.ensure_topics()
    frame = spark.read.format("redrive-kafka").options(
        **{"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true",
           "redrive.decodeHeaders": "true", "startingOffsets": "earliest",
           "endingOffsets": "latest"}).load()
    return pipeline.body(), frame


def test_a_replayed_batch_copies_only_what_its_first_run_did_not(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """Batch 0 is cut short after one of its three copies; its replay writes the other two,
    and a second replay of a finished batch writes nothing."""
    topic, group = new_topic(), unique_name("replay")
    body, frame = four_ok_three_bad(spark, bootstrap, topic, group, tmp_path)
    dlt = f"{topic}.{group}.dlt"
    # the first run marked the routing and wrote one copy before it died
    consumer = kafka.consumer(bootstrap)
    marks = {f"{dlt}:0": kafka.watermarks(consumer, dlt, 0)[1]}
    consumer.close()
    append(kafka.producer(bootstrap), ledger_topic(group),
           Entry(0, ROUTING, marks, {"checkpoint": body.checkpoint,
                                     "query": query_id(spark, body.checkpoint)}))
    first = transform(frame).where("error IS NOT NULL").select("offset").orderBy("offset").first()
    row = frame.where(f"offset = {first['offset']}").first().asDict()
    decision = route(record_of(row), ErrorInfo("ParseError", "cannot parse"), POLICY, 0,
                     group=group)
    produce_input(bootstrap, [kafka.OutRecord(
        dlt, row["value"], row["key"], decision.headers, 0)])

    body(frame, 0)
    body(frame, 0)  # finished: nothing again
    copies = read_all(bootstrap, dlt)
    assert sorted(h.read_delivery(kafka.message_headers(m)).original.offset  # type: ignore
                  for m in copies) == [4, 5, 6]
    assert spark.read.parquet(str(tmp_path / "out")).count() == 4
    # another query's batch 0 into the same sink (a checkpoint made afresh at the same path)
    # adds its rows, and copies its failures again, beside the first query's
    replace(body, checkpoint=query_checkpoint(tmp_path / "cp"))(frame, 0)
    assert spark.read.parquet(str(tmp_path / "out")).count() == 8
    assert len(read_all(bootstrap, dlt)) == 6


def test_a_batch_run_again_after_its_ledger_entry_was_lost_copies_nothing_twice(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker restart can lose an acknowledged write (noida-db after a SIGKILL): here the
    batch's routing entry in the ledger, while its three copies stay; the batch's producer then
    fails for good and new producers run the batch again. The run again takes the marks its
    first attempt took, finds the three copies since them and writes none again."""
    topic, group = new_topic(), unique_name("lostentry")
    body, frame = four_ok_three_bad(spark, bootstrap, topic, group, tmp_path)
    written = append
    calls: list[str] = []

    def losing(producer: Any, name: str, entry: Entry) -> None:
        calls.append(entry.state)
        if calls == [ROUTING]:
            return  # acknowledged, then lost with the broker
        if len(calls) == 2:
            raise KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                            "state lost", fatal=True))
        written(producer, name, entry)

    monkeypatch.setattr("redrive.spark.ledger.append", losing)
    body(frame, 0)

    dlt = f"{topic}.{group}.dlt"
    copies = read_all(bootstrap, dlt)
    assert sorted(h.read_delivery(kafka.message_headers(m)).original.offset  # type: ignore
                  for m in copies) == [4, 5, 6]
    # first attempt: routing (lost), done (failed); again: routing with its marks, then done
    assert calls == [ROUTING, DONE, ROUTING, DONE]
    assert spark.read.parquet(str(tmp_path / "out")).count() == 4
