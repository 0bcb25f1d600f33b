"""A group's dead-letter topic as a DataFrame on real Spark and noida-db: redrive's, Spring
Kafka's, Kafka Connect's and Kafka Streams' dead letters decoded into the same columns, queried
with SQL, and a selection replayed through the replay log (once only)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.policy import Backoff, RetryPolicy, error_type
from redrive.record import ErrorInfo, Record
from redrive.routing import route
from redrive.spark import dead_letters, replay

from .test_pipeline import read_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]

POLICY = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=error_type("ParseError"))
FIRST_FAILURE_MS = 1_700_000_000_000


def redrive_letter(topic: str, group: str, key: str, offset: int, error: ErrorInfo
                   ) -> kafka.OutRecord:
    """A dead letter as redrive writes it, from the routing decisions themselves: a retryable
    error is retried once (POLICY's one retry), then exhausted."""
    record = Record(topic, 0, offset, FIRST_FAILURE_MS, key.encode(), f"v-{key}".encode(), [])
    decision = route(record, error, POLICY, FIRST_FAILURE_MS, group=group)
    if decision.topic != f"{topic}.{group}.dlt":
        retried = Record(decision.topic or "", 0, 0, FIRST_FAILURE_MS + 1000, record.key,
                         record.value, list(decision.headers))
        decision = route(retried, error, POLICY, FIRST_FAILURE_MS + 2000, group=group)
    assert decision.topic == f"{topic}.{group}.dlt"
    return kafka.OutRecord(decision.topic, record.value, record.key, decision.headers, 0)


def foreign_letters(dlt: str) -> list[kafka.OutRecord]:
    spring = [("kafka_dlt-original-topic", b"payments"),
              ("kafka_dlt-original-partition", (2).to_bytes(4, "big")),
              ("kafka_dlt-original-offset", (41).to_bytes(8, "big")),
              ("kafka_dlt-original-timestamp", (FIRST_FAILURE_MS).to_bytes(8, "big")),
              ("kafka_dlt-original-consumer-group", b"java-billing"),
              ("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException"),
              ("kafka_dlt-exception-message", b"bad state"),
              ("kafka_dlt-exception-stacktrace", b"at Foo.bar(Foo.java:1)")]
    connect = [("__connect.errors.topic", b"inventory"), ("__connect.errors.partition", b"1"),
               ("__connect.errors.offset", b"7"),
               ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors."
                                                         b"DataException"),
               ("__connect.errors.exception.message", b"cannot convert"),
               ("__connect.errors.exception.stacktrace", b"trace")]
    streams = [("__streams.errors.topic", b"clicks"), ("__streams.errors.partition", b"0"),
               ("__streams.errors.offset", b"9"),
               ("__streams.errors.exception", b"org.apache.kafka.common.errors."
                                              b"SerializationException"),
               ("__streams.errors.message", b"bad bytes"), ("__streams.errors.stacktrace", b"t")]
    malformed = [(h.REASON, b"exhausted"), (h.ATTEMPT, b"two")]
    return [kafka.OutRecord(dlt, b"s", b"spring", spring, 0),
            kafka.OutRecord(dlt, b"c", b"connect", connect, 0),
            kafka.OutRecord(dlt, b"k", b"streams", streams, 0),
            kafka.OutRecord(dlt, b"m", b"malformed", malformed, 0),
            kafka.OutRecord(dlt, b"p", b"plain", [], 0)]


@pytest.fixture
def letters(bootstrap: str, new_topic: Any, unique_name: Any) -> tuple[str, str, str]:
    topic, group = new_topic(1), unique_name("table")
    dlt = f"{topic}.{group}.dlt"
    kafka.create_topics(kafka.admin(bootstrap), {dlt: 1})
    parse = ErrorInfo("app.ParseError", "cannot parse order 7")
    records = [redrive_letter(topic, group, f"bad{i}", 10 + i, parse) for i in range(3)]
    records.append(redrive_letter(topic, group, "odd", 20, ErrorInfo("KeyError", "no field")))
    kafka.produce_confirmed(kafka.producer(bootstrap), records + foreign_letters(dlt))
    return topic, group, dlt


def test_every_system_decodes_into_the_same_columns(spark: Any, bootstrap: str,
                                                    letters: tuple[str, str, str]) -> None:
    topic, group, dlt = letters
    rows = {bytes(r["key"]).decode(): r.asDict() for r in
            dead_letters(spark, bootstrap, topic, group).collect()}
    assert len(rows) == 9
    bad = rows["bad1"]
    assert (bad["system"], bad["reason"], bad["error_type"], bad["error_message"]) == (
        "redrive", "not-retryable", "app.ParseError", "cannot parse order 7")
    assert (bad["original_topic"], bad["original_partition"], bad["original_offset"]) == (
        topic, 0, 11)
    assert (bad["attempt"], bad["group"], bytes(bad["value"])) == (1, group, b"v-bad1")
    assert int(bad["first_failure"].timestamp() * 1000) == FIRST_FAILURE_MS
    assert (bad["dlt_topic"], bad["dlt_partition"], bad["dlt_offset"]) == (dlt, 0, 1)
    assert (bad["dlt_main_topic"], bad["dlt_group"]) == (topic, group)
    spring = rows["spring"]
    assert (spring["system"], spring["error_type"], spring["group"]) == (
        "spring", "java.lang.IllegalStateException", "java-billing")
    assert (spring["original_topic"], spring["original_partition"],
            spring["original_offset"]) == ("payments", 2, 41)
    assert int(spring["original_timestamp"].timestamp() * 1000) == FIRST_FAILURE_MS
    assert spring["error_trace"] == "at Foo.bar(Foo.java:1)"
    assert (rows["connect"]["system"], rows["connect"]["original_offset"],
            rows["connect"]["error_message"]) == ("connect", 7, "cannot convert")
    assert (rows["streams"]["system"], rows["streams"]["original_topic"]) == ("streams", "clicks")
    odd = rows["odd"]
    assert (odd["reason"], odd["attempt"], odd["error_type"]) == ("exhausted", 2, "KeyError")
    assert (odd["original_topic"], odd["original_offset"]) == (topic, 20)
    assert int(odd["first_failure"].timestamp() * 1000) == FIRST_FAILURE_MS
    malformed = rows["malformed"]
    assert malformed["system"] is None and "two" in malformed["problem"]
    assert rows["plain"]["system"] is None and rows["plain"]["problem"] is None


def test_failures_can_be_queried_with_sql(spark: Any, bootstrap: str,
                                          letters: tuple[str, str, str]) -> None:
    topic, group, _ = letters
    dead_letters(spark, bootstrap, topic, group).createOrReplaceTempView("failures")
    counted = {r["system"]: r["n"] for r in spark.sql(
        "SELECT system, count(*) AS n FROM failures WHERE problem IS NULL GROUP BY system"
    ).collect()}
    assert counted == {"redrive": 4, "spring": 1, "connect": 1, "streams": 1, None: 1}
    parse = spark.sql("SELECT count(*) FROM failures WHERE error_type LIKE '%ParseError'")
    assert parse.collect()[0][0] == 3


def test_an_empty_dead_letter_topic_has_no_rows_and_an_unknown_one_is_named(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    topic, group = new_topic(1), unique_name("empty")
    kafka.create_topics(kafka.admin(bootstrap), {f"{topic}.{group}.dlt": 2})
    assert dead_letters(spark, bootstrap, topic, group).count() == 0
    with pytest.raises(UnknownTopic, match=f"{topic}.nobody.dlt"):
        dead_letters(spark, bootstrap, topic, "nobody")


def test_a_selection_is_replayed_once_through_the_replay_log(
        spark: Any, bootstrap: str, letters: tuple[str, str, str]) -> None:
    topic, group, _ = letters
    table = dead_letters(spark, bootstrap, topic, group)
    selection = table.where("error_type LIKE '%ParseError'")
    [dry] = replay(selection, bootstrap, dry_run=True)
    assert (dry.selected, len(dry.planned), dry.replayed) == (3, 3, [])
    assert read_all(bootstrap, topic) == []

    [report] = replay(selection, bootstrap, actor="test")
    assert (report.selected, len(report.replayed)) == (3, 3)
    copies = read_all(bootstrap, topic)
    assert sorted(m.key().decode() for m in copies) == ["bad0", "bad1", "bad2"]
    assert {bytes(m.value()) for m in copies} == {b"v-bad0", b"v-bad1", b"v-bad2"}

    [again] = replay(selection, bootstrap, actor="test")
    assert (len(again.replayed), len(again.already)) == (0, 3)
    time.sleep(0.5)
    assert len(read_all(bootstrap, topic)) == 3


def test_replay_to_a_retry_topic_needs_the_policy_and_the_table_columns(
        spark: Any, bootstrap: str, letters: tuple[str, str, str]) -> None:
    topic, group, _ = letters
    table = dead_letters(spark, bootstrap, topic, group)
    with pytest.raises(InvalidArgument, match="policy"):
        replay(table, bootstrap, to="retry")
    with pytest.raises(InvalidArgument, match="dlt_topic"):
        replay(table.select("key", "value"), bootstrap)
    kafka.create_topics(kafka.admin(bootstrap), {f"{topic}.{group}.retry.1s": 1})
    [report] = replay(table.where("key = CAST('bad0' AS BINARY)"), bootstrap, to="retry",
                      policy=POLICY)
    assert len(report.replayed) == 1
    copies = read_all(bootstrap, f"{topic}.{group}.retry.1s")
    assert [m.key() for m in copies] == [b"bad0"]


def test_the_table_on_spark_connect(connect_spark: Any, bootstrap: str,
                                    letters: tuple[str, str, str]) -> None:
    topic, group, _ = letters
    frame = dead_letters(connect_spark, bootstrap, topic, group)
    systems = Counter(r["system"] for r in frame.collect())
    assert systems == {"redrive": 4, "spring": 1, "connect": 1, "streams": 1, None: 2}
