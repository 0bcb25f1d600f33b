"""A group's dead-letter topic as a table, on real Spark and the session's broker: redrive's,
Spring Kafka's, Kafka Connect's and Kafka Streams' dead letters decoded into the same columns,
queried with SQL, and a selection replayed through the replay log, each record once, on the
classic session and on Spark Connect."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.ops.replay import first_retry_topic, read_log
from redrive.ops.selection import replay_selection
from redrive.policy import Backoff, RetryPolicy, error_type
from redrive.record import ErrorInfo, Record
from redrive.routing import DeadLetter, route
from redrive.spark import dead_letters

from ..records import produce_input
from .test_pipeline import read_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# One retry, so that a retryable error is dead-lettered as exhausted on its second failure.
POLICY = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=error_type("ParseError"))
PRODUCED_MS = 1_700_000_000_000  # the original records' timestamp
FAILED_MS = PRODUCED_MS + 5_000  # their first failure
PARSE = ErrorInfo("app.ParseError", "cannot parse order")


@dataclass(frozen=True)
class Letters:
    topic: str
    group: str
    dlt: str


def stamp_ms(value: dt.datetime | None) -> int | None:
    return None if value is None else round(value.timestamp() * 1000)


def redrive_letter(topic: str, group: str, key: str, offset: int, error: ErrorInfo,
                   headers: list[tuple[str, bytes]] | None = None) -> DeadLetter:
    """The dead letter redrive's routing makes of a record of `topic` failing in `group`: a
    retryable error is retried once and dead-lettered on its second failure."""
    record = Record(topic, 0, offset, PRODUCED_MS, key.encode(), f"v-{key}".encode(),
                    headers or [])
    decision = route(record, error, POLICY, FAILED_MS, group=group)
    if not isinstance(decision, DeadLetter):
        retried = Record(decision.topic, 0, 0, FAILED_MS, record.key, record.value,
                         list(decision.headers))
        decision = route(retried, error, POLICY, FAILED_MS + 1_000, group=group)
    assert isinstance(decision, DeadLetter), decision
    return decision


def out(dlt: str, partition: int, key: str, headers: list[tuple[str, bytes]],
        value: bytes | None = None) -> kafka.OutRecord:
    return kafka.OutRecord(dlt, value if value is not None else f"v-{key}".encode(),
                           key.encode(), headers, partition)


def foreign_headers() -> dict[str, list[tuple[str, bytes]]]:
    """Dead-letter headers as Spring Kafka, Kafka Connect and Kafka Streams write them."""
    return {
        "spring": [("kafka_dlt-original-topic", b"payments"),
                   ("kafka_dlt-original-partition", (2).to_bytes(4, "big")),
                   ("kafka_dlt-original-offset", (41).to_bytes(8, "big")),
                   ("kafka_dlt-original-timestamp", PRODUCED_MS.to_bytes(8, "big")),
                   ("kafka_dlt-original-consumer-group", b"java-billing"),
                   ("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException"),
                   ("kafka_dlt-exception-message", b"bad state"),
                   ("kafka_dlt-exception-stacktrace", b"at Foo.bar(Foo.java:1)")],
        "connect": [("__connect.errors.topic", b"inventory"),
                    ("__connect.errors.partition", b"1"), ("__connect.errors.offset", b"7"),
                    ("__connect.errors.exception.class.name",
                     b"org.apache.kafka.connect.errors.DataException"),
                    ("__connect.errors.exception.message", b"cannot convert"),
                    ("__connect.errors.exception.stacktrace", b"connect trace")],
        "streams": [("__streams.errors.topic", b"clicks"), ("__streams.errors.partition", b"3"),
                    ("__streams.errors.offset", b"9"),
                    ("__streams.errors.exception",
                     b"org.apache.kafka.common.errors.SerializationException"),
                    ("__streams.errors.message", b"bad bytes"),
                    ("__streams.errors.stacktrace", b"streams trace")],
    }


@pytest.fixture
def letters(bootstrap: str, new_topic: Any, unique_name: Any) -> Letters:
    """Ten dead letters over the two partitions of a group's dead-letter topic:
    partition 0: bad0, bad1 (ParseError), odd (KeyError, exhausted), routed (malformed),
    broken (a redrive header that cannot be read); partition 1: bad2, spring, connect,
    streams, plain (no headers at all)."""
    topic, group = new_topic(1), unique_name("table")
    dlt = new_topic(2, name=f"{topic}.{group}.dlt")
    bad = [redrive_letter(topic, group, f"bad{i}", 10 + i, PARSE) for i in range(3)]
    odd = redrive_letter(topic, group, "odd", 20, ErrorInfo("KeyError", "no field 'total'"))
    routed = redrive_letter(topic, group, "routed", 30, PARSE, [(h.ATTEMPT, b"two")])
    broken = [(name, b"eleven" if name == h.ORIGINAL_OFFSET else value)
              for name, value in bad[1].headers]
    foreign = foreign_headers()
    records = [out(dlt, 0, "bad0", bad[0].headers), out(dlt, 0, "bad1", bad[1].headers),
               out(dlt, 0, "odd", odd.headers), out(dlt, 0, "routed", routed.headers),
               out(dlt, 0, "broken", broken),
               out(dlt, 1, "bad2", bad[2].headers),
               *(out(dlt, 1, system, foreign[system]) for system in foreign),
               out(dlt, 1, "plain", [])]
    produce_input(bootstrap, records)
    return Letters(topic, group, dlt)


@pytest.fixture(params=["classic", "connect"])
def session(request: pytest.FixtureRequest) -> Any:
    """The classic session, then the Spark Connect one: the table and replays serve both."""
    return request.getfixturevalue("spark" if request.param == "classic" else "connect_spark")


def test_each_system_s_dead_letters_decode_into_the_same_columns(
        session: Any, bootstrap: str, letters: Letters) -> None:
    rows = {bytes(r["key"]).decode(): r.asDict()
            for r in dead_letters(session, bootstrap, letters.topic, letters.group).collect()}
    assert sorted(rows) == sorted(["bad0", "bad1", "bad2", "odd", "routed", "broken", "spring",
                                   "connect", "streams", "plain"])

    bad = rows["bad1"]
    assert (bad["dlt_topic"], bad["dlt_partition"], bad["dlt_offset"]) == (letters.dlt, 0, 1)
    assert (bad["dlt_main_topic"], bad["dlt_group"]) == (letters.topic, letters.group)
    assert isinstance(bad["dlt_timestamp"], dt.datetime)
    assert (bad["system"], bad["reason"], bad["error_type"], bad["error_message"]) == (
        "redrive", "not-retryable", "app.ParseError", "cannot parse order")
    assert (bad["original_topic"], bad["original_partition"], bad["original_offset"]) == (
        letters.topic, 0, 11)
    assert stamp_ms(bad["original_timestamp"]) == PRODUCED_MS
    assert stamp_ms(bad["first_failure"]) == FAILED_MS
    assert (bad["attempt"], bad["group"], bad["problem"]) == (1, letters.group, None)
    assert bytes(bad["value"]) == b"v-bad1"
    assert (h.REASON, b"not-retryable") in [(p["key"], bytes(p["value"])) for p in bad["headers"]]
    assert (rows["bad2"]["dlt_partition"], rows["bad2"]["original_offset"]) == (1, 12)

    odd = rows["odd"]
    assert (odd["reason"], odd["attempt"], odd["error_type"], odd["error_message"]) == (
        "exhausted", 2, "KeyError", "no field 'total'")
    assert (odd["original_topic"], odd["original_offset"]) == (letters.topic, 20)
    assert stamp_ms(odd["first_failure"]) == FAILED_MS  # kept from the first failure

    assert (rows["routed"]["system"], rows["routed"]["reason"], rows["routed"]["attempt"],
            rows["routed"]["problem"]) == ("redrive", "malformed", 1, None)

    broken = rows["broken"]
    assert broken["system"] is None and broken["reason"] is None
    assert h.ORIGINAL_OFFSET in broken["problem"] and "eleven" in broken["problem"]
    assert (bytes(broken["key"]), bytes(broken["value"])) == (b"broken", b"v-broken")

    spring = rows["spring"]
    assert (spring["system"], spring["error_type"], spring["error_message"],
            spring["error_trace"], spring["group"]) == (
        "spring", "java.lang.IllegalStateException", "bad state", "at Foo.bar(Foo.java:1)",
        "java-billing")
    assert (spring["original_topic"], spring["original_partition"],
            spring["original_offset"]) == ("payments", 2, 41)
    assert stamp_ms(spring["original_timestamp"]) == PRODUCED_MS
    assert (spring["reason"], spring["attempt"], spring["first_failure"]) == (None, None, None)

    connect = rows["connect"]
    assert (connect["system"], connect["error_type"], connect["error_message"],
            connect["error_trace"]) == (
        "connect", "org.apache.kafka.connect.errors.DataException", "cannot convert",
        "connect trace")
    assert (connect["original_topic"], connect["original_partition"],
            connect["original_offset"], connect["group"]) == ("inventory", 1, 7, None)

    streams = rows["streams"]
    assert (streams["system"], streams["error_type"], streams["error_message"]) == (
        "streams", "org.apache.kafka.common.errors.SerializationException", "bad bytes")
    assert (streams["original_topic"], streams["original_partition"],
            streams["original_offset"]) == ("clicks", 3, 9)

    plain = rows["plain"]
    assert [plain[name] for name in ("system", "reason", "error_type", "original_topic",
                                     "problem")] == [None] * 5
    assert (bytes(plain["value"]), plain["headers"]) == (b"v-plain", None)  # as Spark's source


def test_the_table_answers_sql_through_a_temp_view(spark: Any, bootstrap: str,
                                                    letters: Letters) -> None:
    dead_letters(spark, bootstrap, letters.topic, letters.group) \
        .createOrReplaceTempView("dead_letters_sql")
    by_type = {r["error_type"]: r["n"] for r in spark.sql(
        "SELECT error_type, count(*) AS n FROM dead_letters_sql GROUP BY error_type").collect()}
    assert by_type == {"app.ParseError": 3, "KeyError": 1,
                       "redrive.errors.MalformedHeader": 1,
                       "java.lang.IllegalStateException": 1,
                       "org.apache.kafka.connect.errors.DataException": 1,
                       "org.apache.kafka.common.errors.SerializationException": 1, None: 2}
    offsets = spark.sql("SELECT original_offset FROM dead_letters_sql WHERE system = 'redrive' "
                        "AND reason = 'not-retryable' ORDER BY original_offset").collect()
    assert [r[0] for r in offsets] == [10, 11, 12]


def test_an_empty_dead_letter_topic_gives_no_rows_and_an_unknown_one_is_named(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    topic, group = new_topic(1), unique_name("empty")
    new_topic(2, name=f"{topic}.{group}.dlt")
    assert dead_letters(spark, bootstrap, topic, group).count() == 0
    with pytest.raises(UnknownTopic, match=f"'{topic}.nobody.dlt'"):
        dead_letters(spark, bootstrap, topic, "nobody")
    with pytest.raises(InvalidArgument, match="invalid group="):
        dead_letters(spark, bootstrap, topic, "no/such")


def test_a_selection_is_replayed_to_its_original_topic_once(
        session: Any, bootstrap: str, letters: Letters) -> None:
    dead_letters(session, bootstrap, letters.topic, letters.group) \
        .createOrReplaceTempView("dead_letters_replay")
    selection = session.sql("SELECT * FROM dead_letters_replay WHERE error_type = 'app.ParseError'")

    [dry] = replay_selection(selection, bootstrap, dry_run=True)
    assert (dry.selected, dry.replayed) == (3, [])
    assert sorted(source for source, _ in dry.planned) == [
        (letters.dlt, 0, 0), (letters.dlt, 0, 1), (letters.dlt, 1, 0)]
    assert {to for _, to in dry.planned} == {letters.topic}
    assert read_all(bootstrap, letters.topic) == []

    [report] = replay_selection(selection, bootstrap, actor="on-call@test")
    assert (report.selected, len(report.replayed), report.already) == (3, 3, [])
    copies = {m.key().decode(): m for m in read_all(bootstrap, letters.topic)}
    assert sorted(copies) == ["bad0", "bad1", "bad2"]
    for index, key in enumerate(["bad0", "bad1", "bad2"]):
        copy = copies[key]
        headers = dict(copy.headers())
        assert copy.value() == f"v-{key}".encode()
        assert headers[h.GROUP] == letters.group.encode()
        assert headers[h.ORIGINAL_TOPIC] == letters.topic.encode()
        assert headers[h.ORIGINAL_OFFSET] == str(10 + index).encode()
        assert headers[h.ERROR_TYPE] == b"app.ParseError"
        assert int(headers[h.DUE]) <= now_ms()
        # A fresh start: the policy's attempts and deadline count from the replay.
        assert not {h.REASON, h.ATTEMPT, h.FIRST_FAILURE} & set(headers)
    log = read_log(bootstrap, letters.dlt)
    assert sorted(log) == [f"{letters.dlt}/0/0", f"{letters.dlt}/0/1", f"{letters.dlt}/1/0"]
    assert {entry["who"] for entry in log.values()} == {"on-call@test"}

    [again] = replay_selection(selection, bootstrap, actor="on-call@test")
    assert (again.selected, again.replayed, len(again.already)) == (3, [], 3)
    assert len(read_all(bootstrap, letters.topic)) == 3


def test_replay_to_the_retry_topic_and_what_it_refuses(
        spark: Any, bootstrap: str, new_topic: Any, letters: Letters) -> None:
    table = dead_letters(spark, bootstrap, letters.topic, letters.group)
    with pytest.raises(InvalidArgument, match="invalid policy=None"):
        replay_selection(table, bootstrap, to="retry")
    with pytest.raises(InvalidArgument, match=r"invalid policy=.*original"):
        replay_selection(table, bootstrap, policy=POLICY)
    with pytest.raises(InvalidArgument, match="invalid to='sideways'"):
        replay_selection(table, bootstrap, to="sideways")
    with pytest.raises(InvalidArgument, match="dlt_topic, dlt_partition, dlt_offset"):
        replay_selection(table.select("key", "value"), bootstrap)
    with pytest.raises(InvalidArgument, match="invalid selection='list'"):
        replay_selection([], bootstrap)
    with pytest.raises(InvalidArgument, match="invalid rate='fast'"):
        replay_selection(table, bootstrap, rate="fast")

    retry_topic = new_topic(1, name=first_retry_topic(POLICY, letters.topic, letters.group))
    [report] = replay_selection(table.where("key = CAST('odd' AS BINARY)"), bootstrap,
                                to="retry", policy=POLICY, keep_attempts=True)
    assert [copy.destination[0] for copy in report.replayed] == [retry_topic]
    [copy] = read_all(bootstrap, retry_topic)
    headers = dict(copy.headers())
    assert (copy.key(), headers[h.ATTEMPT], headers[h.FIRST_FAILURE]) == (
        b"odd", b"2", str(FAILED_MS).encode())

    # Connect names no group: the copy takes the table's; its original topic does not exist.
    [skipped] = replay_selection(table.where("system = 'connect'"), bootstrap)
    assert [(s.source, s.why) for s in skipped.skipped] == [
        ((letters.dlt, 1, 2), "destination topic 'inventory' does not exist")]

