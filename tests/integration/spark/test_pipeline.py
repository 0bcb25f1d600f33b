"""RetryPipeline end to end on real Spark and noida-db: failure, retry when due, success, DLT."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

from redrive import headers as h
from redrive import kafka
from redrive.policy import Backoff, RetryPolicy
from redrive.spark import RetryPipeline
from redrive.spark.sql import functions

from ..records import produce_input

# Spark workers cannot import test modules: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

POLICY = RetryPolicy(backoff=Backoff.sequence("1s,2s"), not_retryable=ValueError)
OUTPUT = "key string, attempt int, late_ms long"


def handle(record: dict[str, Any]) -> dict[str, Any]:
    """Behaviour is spelled in the value: ok, fail1, fail2, poison, forever."""
    kind = record["value"].decode().split(":")[0]
    attempt = record["attempt"]
    if kind == "poison":
        raise ValueError("poison record")
    if kind == "forever" or (kind == "fail1" and attempt < 1) or (kind == "fail2" and attempt < 2):
        raise ConnectionError(f"upstream down (attempt {attempt})")
    due = h.read_due(record["headers"])
    late = 0 if due is None else int(time.time() * 1000) - due
    return {"key": record["key"].decode(), "attempt": attempt, "late_ms": late}


def handle_in_sql(frame: Any) -> Any:
    """handle as a DataFrame transform: its errors a column, no Python per record."""
    F = functions(frame)

    kind = F.split(F.col("value").cast("string"), ":")[0]
    attempt = F.col("redrive.attempt")

    def error(type_name: str, message: str) -> Any:
        return F.struct(F.lit(type_name).alias("type"), F.lit(message).alias("message"))

    failed = (F.when(kind == "poison", error("ValueError", "poison record"))
              .when((kind == "forever") | ((kind == "fail1") & (attempt < 1))
                    | ((kind == "fail2") & (attempt < 2)),
                    error("ConnectionError", "upstream down")))
    late = F.coalesce(F.unix_millis(F.current_timestamp()) - F.unix_millis(F.col("redrive.due")),
                      F.lit(0))
    return frame.select(F.col("key").cast("string").alias("key"),
                        attempt.cast("int").alias("attempt"), late.alias("late_ms"),
                        "topic", "partition", "offset", failed.alias("error"))


# RetryPipeline's logic in the per-record form and in the DataFrame form, behaving alike.
FORMS: dict[str, dict[str, Any]] = {
    "function": {"function": handle, "output_schema": OUTPUT},
    "frame": {"transform": handle_in_sql},
}


def produce(bootstrap: str, topic: str, kinds: list[str], start: int = 0) -> dict[str, str]:
    sent = {f"k{start + i}": kind for i, kind in enumerate(kinds)}
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"{kind}:{key}".encode(), key.encode(), [("trace", b"\x01\xfe")])
        for key, kind in sent.items()])
    return sent


def collecting_sink(rows: list[Any]) -> Any:
    def sink(frame: Any, batch_id: int) -> None:
        rows.extend(frame.collect())
    return sink


def read_all(bootstrap: str, topic: str) -> list[Any]:
    consumer = kafka.consumer(bootstrap, overrides={"enable.partition.eof": True})
    partitions = kafka.topic_partitions(kafka.admin(bootstrap))[topic]
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages, ended = [], set()
    deadline = time.monotonic() + 20
    while len(ended) < partitions and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            ended.add(message.partition())
            continue
        messages.append(message)
    consumer.close()
    return messages


def test_full_cycle_retry_when_due_then_success_and_dead_letters(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("pipe")
    kinds = ["ok"] * 20 + ["fail1"] * 6 + ["fail2"] * 4 + ["poison"] * 3 + ["forever"] * 2
    sent = produce(bootstrap, topic, kinds)
    rows: list[Any] = []
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, function=handle,
                             output_schema=OUTPUT, sink=collecting_sink(rows),
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds")
    stats = pipeline.run(until=lambda s: s.finished >= len(kinds), timeout_s=150)

    by_key = {row["key"]: row for row in rows}
    assert len(rows) == len(by_key) == 30  # every success once
    assert Counter(row["attempt"] for row in rows) == {0: 20, 1: 6, 2: 4}
    assert all(row["late_ms"] >= 0 for row in rows)  # never handled before due
    assert stats.early == 0
    assert stats.retried_by_attempt == {1: 12, 2: 6}
    assert stats.dead_lettered_by_reason == {"not-retryable": 3, "exhausted": 2}
    # 35 first deliveries and 18 retries (fail1 once, fail2 twice, forever twice) were handled;
    # the 18 retries carried due times
    assert pipeline.metrics.value("redrive_handler_seconds_count") == 53
    assert pipeline.metrics.value("redrive_lateness_seconds_count") == 18
    assert pipeline.metrics.value("redrive_retried_total", topic=topic, attempt="1") == 12
    assert pipeline.metrics.value("redrive_processed_total", topic=topic) == 30

    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert len(dead) == 5
    for message in dead:
        pairs = kafka.message_headers(message)
        key = message.key().decode()
        reason = h.last(pairs, h.REASON)
        assert reason == (b"not-retryable" if sent[key] == "poison" else b"exhausted")
        delivery = h.read_delivery(pairs)
        assert delivery.original is not None and delivery.original.topic == topic
        assert delivery.group == group
        assert delivery.attempt == (1 if sent[key] == "poison" else 3)
        assert h.last(pairs, h.ERROR_TYPE) == (
            b"ValueError" if sent[key] == "poison" else b"ConnectionError")
        assert ("trace", b"\x01\xfe") in pairs  # the record's own headers survive
        assert h.last(pairs, h.DUE) is None

    retries = read_all(bootstrap, f"{topic}.{group}.retry.1s")
    assert len(retries) == 12
    for message in retries:
        pairs = kafka.message_headers(message)
        delivery = h.read_delivery(pairs)
        assert delivery.attempt == 1 and delivery.due_ms is not None
        assert delivery.first_failure_ms is not None
        assert delivery.due_ms >= delivery.first_failure_ms + 1000
        assert delivery.original is not None
        assert message.partition() == delivery.original.partition  # partition kept

    committed = kafka.consumer(bootstrap, group).committed(
        [__import__("confluent_kafka").TopicPartition(topic, p) for p in range(2)], timeout=10)
    assert sum(tp.offset for tp in committed) == len(kinds)  # progress visible to lag tools


def test_restart_from_checkpoint_loses_nothing(spark: Any, bootstrap: str, new_topic: Any,
                                               unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("restart")
    rows: list[Any] = []
    first = produce(bootstrap, topic, ["ok"] * 15 + ["fail1"] * 5)
    options = {"function": handle, "output_schema": OUTPUT, "sink": collecting_sink(rows),
               "checkpoint": str(tmp_path / "cp"), "trigger_interval": "300 milliseconds"}
    RetryPipeline(spark, bootstrap, topic, group, POLICY, **options).run(
        until=lambda s: s.succeeded >= 15, timeout_s=90)
    second = produce(bootstrap, topic, ["ok"] * 10 + ["fail1"] * 3, start=len(first))
    total = len(first) + len(second)
    RetryPipeline(spark, bootstrap, topic, group, POLICY, **options).run(
        until=lambda s: len({r["key"] for r in rows}) >= total, timeout_s=90)
    keys = [row["key"] for row in rows]
    assert set(keys) == set(first) | set(second)
    assert len(keys) == len(set(keys))


def test_retries_left_in_an_earlier_policys_topics_are_read_after_a_policy_change(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("former")
    before = RetryPolicy(backoff=Backoff.fixed("15s"), attempts=3)
    after = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=3)
    sent = produce(bootstrap, topic, ["ok"] * 10 + ["fail1"] * 5)
    rows: list[Any] = []
    options = {"function": handle, "output_schema": OUTPUT, "sink": collecting_sink(rows),
               "checkpoint": str(tmp_path / "cp"), "trigger_interval": "300 milliseconds"}
    first = RetryPipeline(spark, bootstrap, topic, group, before, **options).run(
        until=lambda s: s.succeeded >= 10 and s.retried_by_attempt.get(1, 0) >= 5, timeout_s=90)
    assert first.retried_by_attempt == {1: 5}
    assert sorted(row["attempt"] for row in rows) == [0] * 10  # stopped before the copies were due

    second = RetryPipeline(spark, bootstrap, topic, group, after, **options)
    second.run(until=lambda s: len(rows) >= 15, timeout_s=90)
    old_retry = f"{topic}.{group}.retry.15s"
    assert old_retry in second.consumed_topics
    assert second.source_options()["redrive.gatedTopics"].split(",") == [
        f"{topic}.{group}.retry.1s", old_retry]
    assert sorted(row["key"] for row in rows) == sorted(sent)  # each once
    retried = [row for row in rows if sent[row["key"]] == "fail1"]
    assert [row["attempt"] for row in retried] == [1] * 5
    assert all(row["late_ms"] >= 0 for row in retried)  # never before the earlier policy's due


def test_vectorized_form(spark: Any, bootstrap: str, new_topic: Any, unique_name: Any,
                         tmp_path: Path) -> None:
    topic = new_topic()
    group = unique_name("vec")
    produce(bootstrap, topic, ["ok"] * 8 + ["poison"] * 2)

    def batch(frame: pd.DataFrame) -> pd.DataFrame:
        values = [bytes(v).decode() for v in frame["value"]]
        return pd.DataFrame({
            "key": [bytes(k).decode() for k in frame["key"]],
            "attempt": frame["attempt"],
            "late_ms": 0,
            "error": [ValueError("poison") if v.startswith("poison") else None for v in values],
        })

    rows: list[Any] = []
    stats = RetryPipeline(spark, bootstrap, topic, group, POLICY, batch_function=batch,
                          output_schema=OUTPUT, sink=collecting_sink(rows),
                          checkpoint=str(tmp_path / "cp"),
                          trigger_interval="300 milliseconds").run(
        until=lambda s: s.finished >= 10, timeout_s=90)
    assert len(rows) == 8
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise AttributeError("the message needs an attribute the error lacks")


def handle_odd_errors(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["value"].decode().split(":")[0]
    if kind == "unprintable":
        raise UnprintableError()
    if kind == "undecodable":
        raise ValueError("cannot read " + b"caf\xe9".decode("utf-8", "surrogateescape"))
    return {"key": record["key"].decode(), "attempt": record["attempt"], "late_ms": 0}


def test_errors_whose_text_fails_or_is_not_utf8_are_routed_in_a_spark_task(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """Before, the task failed building the error's Arrow column (or in the error's __str__),
    and so did the batch at every run of it."""
    topic = new_topic()
    group = unique_name("texts")
    produce(bootstrap, topic, ["unprintable", "undecodable", "ok"])
    rows: list[Any] = []
    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, function=handle_odd_errors,
                             output_schema=OUTPUT, sink=collecting_sink(rows),
                             checkpoint=str(tmp_path / "cp"))
    stats = pipeline.run(until=lambda s: sum(s.dead_lettered_by_reason.values()) >= 2,
                         timeout_s=120)
    assert [row["key"] for row in rows] == ["k2"]
    # k0 is retryable: retried twice (1 s, 2 s), then exhausted; k1 is a ValueError.
    assert stats.dead_lettered_by_reason == {"not-retryable": 1, "exhausted": 1}
    assert stats.retried_by_attempt == {1: 1, 2: 1}
    messages = {m.key(): h.last(kafka.message_headers(m), h.ERROR_MESSAGE)
                for m in read_all(bootstrap, f"{topic}.{group}.dlt")}
    assert messages == {b"k0": b"<str() of the error failed: AttributeError>",
                        b"k1": b"cannot read caf\\udce9"}


def test_bad_arguments_fail_before_starting(spark: Any, bootstrap: str) -> None:
    from redrive.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="function"):
        RetryPipeline(spark, bootstrap, "orders", "g", POLICY, output_schema=OUTPUT,
                      sink="out", checkpoint="cp")
    with pytest.raises(InvalidArgument, match="group"):
        RetryPipeline(spark, bootstrap, "orders", "bad group", POLICY, function=handle,
                      output_schema=OUTPUT, sink="out", checkpoint="cp")
    # Its retry and dead-letter topics' names are legal; its batch ledger's is too long.
    with pytest.raises(InvalidArgument, match=r"invalid group='g{233}': the Spark batch ledger"):
        RetryPipeline(spark, bootstrap, "o", "g" * 233, POLICY, function=handle,
                      output_schema=OUTPUT, sink="out", checkpoint="cp")

    async def enrich(record: dict[str, Any]) -> dict[str, Any]:
        return record

    for form in ("function", "batch_function"):  # it would never run: refused, not skipped
        with pytest.raises(InvalidArgument, match=f"invalid {form}=.*is an async function"):
            RetryPipeline(spark, bootstrap, "orders", "g", POLICY, output_schema=OUTPUT,
                          sink="out", checkpoint="cp", **{form: enrich})
    with pytest.raises(InvalidArgument, match="invalid function=42: must be callable"):
        RetryPipeline(spark, bootstrap, "orders", "g", POLICY, function=42,
                      output_schema=OUTPUT, sink="out", checkpoint="cp")
    for field, value in (("checkpoint", ""), ("sink", 42), ("max_offsets_per_trigger", 0),
                         ("available_now", "yes"), ("fail_on_data_loss", None),
                         ("waiting_gauges_every_s", -1), ("on_batch", 5),
                         ("starting_offsets", "earlist"), ("starting_offsets", "{")):
        arguments = {"sink": "out", "checkpoint": "cp", field: value}
        with pytest.raises(InvalidArgument, match=f"invalid {field}={value!r}"):
            RetryPipeline(spark, bootstrap, "orders", "g", POLICY, function=handle,
                          output_schema=OUTPUT, **arguments)


def test_waiting_retries_are_reported_as_gauges(spark: Any, bootstrap: str, new_topic: Any,
                                                unique_name: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("gauges")
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"forever:k{i}".encode(), f"k{i}".encode(), partition=i % 2)
        for i in range(4)])
    hourly = RetryPolicy(backoff=Backoff.fixed("1h"), attempts=2)
    pipeline = RetryPipeline(spark, bootstrap, topic, group, hourly, function=handle,
                             output_schema=OUTPUT, sink=collecting_sink([]),
                             checkpoint=str(tmp_path / "cp"), trigger_interval="300 milliseconds",
                             waiting_gauges_every_s=0)
    stats = pipeline.run(until=lambda s: s.retried >= 4, timeout_s=90)
    assert stats.retried_by_attempt == {1: 4}
    # both retry partitions wait at a copy due in an hour
    assert pipeline.metrics.value("redrive_paused_partitions") == 2
    assert 0 <= pipeline.metrics.value("redrive_oldest_pending_retry_seconds") < 60
