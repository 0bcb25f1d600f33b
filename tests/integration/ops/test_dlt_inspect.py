"""`redrive dlt ls|show` on records dead-lettered by the consumer runtime (with and without
Spring Kafka's header set beside redrive's) and on hand-made Spring Kafka, Kafka Connect, Kafka
Streams, share-group (KIP-1191) and Karafka dead-letter records; bad input."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from redrive import headers as h
from redrive.consumer import RetryingConsumer
from redrive.dev.ports import free_port
from redrive.headers import normalize
from redrive.kafka.ranges import read_topic
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from ..consumer.conftest import FAST_GROUP, Running, wait_until
from .conftest import produce_records, run_cli, run_json, topic_sizes

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Transient(Exception):
    pass


class Permanent(ValueError):
    pass


def test_ls_and_show_what_the_consumer_dead_lettered(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("inspect")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=2, not_retryable=Permanent)

    def handler(record: Record) -> None:
        if record.value == b"flaky":
            raise Transient(f"try {record.delivery.attempt}")
        if record.value == b"bad":
            raise Permanent("cannot parse")

    produce_records(bootstrap, topic, [(b"k-ok", b"ok", []), (b"k-flaky", b"flaky", []),
                                       (b"k-bad", b"bad", [("tenant", b"acme")])], partition=1)
    produce_records(bootstrap, topic, [(b"k-garbled", b"garbled", [(h.ATTEMPT, b"x")])],
                    partition=0)
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 3, 30, "3 dead letters")
    run.stop()

    base = ["dlt", "ls", "-b", bootstrap, "--topic", topic, "--group", group]
    listed = run_json(*base)
    assert len(listed) == 3
    by_key = {item["key"]: item for item in listed}
    assert {k: v["reason"] for k, v in by_key.items()} == {
        "k-flaky": "exhausted", "k-bad": "not-retryable", "k-garbled": "malformed"}
    flaky = by_key["k-flaky"]
    assert flaky["system"] == "redrive" and flaky["attempts"] == 2 and flaky["group"] == group
    assert flaky["error_type"].endswith("Transient") and flaky["error_message"] == "try 1"
    assert flaky["original"]["topic"] == topic
    assert (flaky["original"]["partition"], flaky["original"]["offset"]) == (1, 1)
    assert by_key["k-bad"]["original"]["offset"] == 2
    assert by_key["k-garbled"]["original"]["partition"] == 0
    assert all(0 <= item["age_ms"] < 60_000 for item in listed)

    def keys(*extra: str) -> list[str]:
        return sorted(item["key"] for item in run_json(*base, *extra))

    assert keys("--reason", "not-retryable", "--reason", "malformed") == ["k-bad", "k-garbled"]
    assert keys("--error-type", "Permanent") == ["k-bad"]
    assert keys("--key", "k-flaky") == ["k-flaky"]
    assert keys("--header", "tenant=acme") == ["k-bad"]
    assert keys("--header", "tenant=other") == []
    assert keys("--since", "10m") == ["k-bad", "k-flaky", "k-garbled"]
    assert keys("--until", "10m") == []
    assert keys("--partition", "0") == ["k-garbled"]
    assert len(run_json(*base, "--limit", "2")) == 2

    table = run_cli(*base)
    assert table.exit_code == 0, table.output
    assert "not-retryable" in table.stdout and "3 record(s) in" in table.stdout

    record = f"{by_key['k-flaky']['partition']}:{by_key['k-flaky']['offset']}"
    shown = run_cli("dlt", "show", "-b", bootstrap, "--topic", topic, "--group", group, record)
    assert shown.exit_code == 0, shown.output
    assert f"{h.ORIGINAL_OFFSET}: 1" in shown.stdout
    assert "trace:" in shown.stdout and "Transient: try 1" in shown.stdout
    full = run_json("dlt", "show", "-b", bootstrap, "--dlt-topic", f"{topic}.{group}.dlt",
                    record)
    assert [h.REASON, "exhausted"] in full["headers"] and full["value"] == "flaky"
    assert "Traceback" in full["error_trace"]


def test_spring_header_format_writes_springs_set_beside_redrives(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=1), unique_name("spring-format")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=2, not_retryable=Permanent,
                         header_format="spring")

    def handler(record: Record) -> None:
        if record.value == b"flaky":
            raise Transient(f"try {record.delivery.attempt}")
        if record.value == b"bad":
            raise Permanent("cannot parse")

    produce_records(bootstrap, topic, [(b"k-ok", b"ok", []), (b"k-flaky", b"flaky", []),
                                       (b"k-bad", b"bad", [])])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 2, 30, "2 dead letters")
    run.stop()
    sizes = topic_sizes(bootstrap, f"{topic}.{group}.dlt", f"{topic}.{group}.retry.100ms")
    assert sizes == {f"{topic}.{group}.dlt": 2, f"{topic}.{group}.retry.100ms": 1}

    dead = {message.key(): normalize(message.headers())
            for message in read_topic(bootstrap, f"{topic}.{group}.dlt", 1, idle_s=10)}
    assert set(dead) == {b"k-flaky", b"k-bad"}
    for key, offset, reason in ((b"k-flaky", 1, b"exhausted"), (b"k-bad", 2, b"not-retryable")):
        headers = dead[key]
        assert h.last(headers, h.REASON) == reason
        assert h.last(headers, "kafka_dlt-original-topic") == topic.encode()
        assert struct.unpack(">i", h.last(headers, "kafka_dlt-original-partition") or b"") == (0,)
        assert struct.unpack(">q", h.last(headers, "kafka_dlt-original-offset") or b"") == \
            (offset,)
        assert len(h.last(headers, "kafka_dlt-original-timestamp") or b"") == 8
        assert h.last(headers, "kafka_dlt-original-consumer-group") == group.encode()
    assert (h.last(dead[b"k-bad"], "kafka_dlt-exception-fqcn") or b"").endswith(b"Permanent")
    assert h.last(dead[b"k-bad"], "kafka_dlt-exception-message") == b"cannot parse"
    assert h.last(dead[b"k-flaky"], "kafka_dlt-exception-message") == b"try 1"

    # k-bad was dead-lettered at once, k-flaky only after its retry: k-bad is 0:0
    shown = run_cli("dlt", "show", "-b", bootstrap, "--topic", topic, "--group", group, "0:0")
    assert shown.exit_code == 0, shown.output
    assert "written by: redrive + spring" in shown.stdout
    assert "kafka_dlt-original-offset: 2\n" in shown.stdout
    full = run_json("dlt", "show", "-b", bootstrap, "--topic", topic, "--group", group, "0:0")
    assert full["header_sets"] == ["redrive", "spring"] and full["reason"] == "not-retryable"
    assert ["kafka_dlt-original-partition", "0"] in full["headers"]


def spring_headers(topic: str) -> list[tuple[str, bytes]]:
    return [("kafka_dlt-original-topic", topic.encode()),
            ("kafka_dlt-original-partition", (0).to_bytes(4, "big")),
            ("kafka_dlt-original-offset", (17).to_bytes(8, "big")),
            ("kafka_dlt-original-timestamp", (1_700_000_000_000).to_bytes(8, "big")),
            ("kafka_dlt-original-consumer-group", b"spring-app"),
            ("kafka_dlt-exception-fqcn", b"org.springframework.kafka.ListenerExecutionFailed"),
            ("kafka_dlt-exception-message", b"Listener failed"),
            ("kafka_dlt-exception-stacktrace", b"ListenerExecutionFailed: Listener failed\n"
                                               b"\tat com.shop.Billing.listen(Billing.java:42)")]


def connect_headers(topic: str) -> list[tuple[str, bytes]]:
    return [("__connect.errors.topic", topic.encode()), ("__connect.errors.partition", b"0"),
            ("__connect.errors.offset", b"18"),
            ("__connect.errors.exception.class.name",
             b"org.apache.kafka.connect.errors.DataException"),
            ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data"),
            ("__connect.errors.exception.stacktrace", b"DataException\n\tat Converter")]


def streams_headers(topic: str) -> list[tuple[str, bytes]]:
    return [("__streams.errors.topic", topic.encode()), ("__streams.errors.partition", b"0"),
            ("__streams.errors.offset", b"19"),
            ("__streams.errors.exception",
             b"org.apache.kafka.common.errors.SerializationException"),
            ("__streams.errors.message", b"Size of data received is not 8"),
            ("__streams.errors.stacktrace", b"SerializationException\n\tat Deserializer")]


def share_group_headers(topic: str) -> list[tuple[str, bytes]]:
    return [("__dlq.errors.topic", topic.encode()), ("__dlq.errors.partition", b"0"),
            ("__dlq.errors.offset", b"20"), ("__dlq.errors.group", b"share-app"),
            ("__dlq.errors.delivery.count", b"5"),
            ("__dlq.errors.message", b"delivery attempts exhausted")]


def karafka_headers(topic: str) -> list[tuple[str, bytes]]:
    return [("source_topic", topic.encode()), ("source_partition", b"0"),
            ("source_offset", b"21"), ("source_consumer_group", b"karafka-app")]


def test_ls_and_show_spring_connect_streams_and_an_unreadable_record(
        bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [
        (b"s", b"from spring", spring_headers("orders")),
        (b"c", b"from connect", connect_headers("orders")),
        (b"t", b"from streams", streams_headers("orders")),
        (b"u", b"unreadable", [(h.REASON, b"exhausted"), (h.ORIGINAL_OFFSET, b"minus one")]),
        (b"n", b"no story", [("other", b"1")]),
        (b"q", b"from a share group", share_group_headers("orders")),
        (b"k", b"from karafka", karafka_headers("orders")),
    ])
    listed = {item["key"]: item for item in run_json("dlt", "ls", "-b", bootstrap,
                                                      "--dlt-topic", dlt)}
    assert {k: v["system"] for k, v in listed.items()} == {
        "s": "spring", "c": "connect", "t": "streams", "u": None, "n": None,
        "q": "share-group", "k": "karafka"}
    assert [listed[k]["original"]["offset"] for k in "sctqk"] == [17, 18, 19, 20, 21]
    assert {listed[k]["original"]["topic"] for k in "sctqk"} == {"orders"}
    assert (listed["q"]["group"], listed["q"]["attempts"]) == ("share-app", 5)
    assert listed["k"]["group"] == "karafka-app"
    assert listed["s"]["group"] == "spring-app"
    assert listed["s"]["original"]["timestamp_ms"] == 1_700_000_000_000
    assert listed["c"]["error_type"] == "org.apache.kafka.connect.errors.DataException"
    assert listed["t"]["error_message"] == "Size of data received is not 8"
    assert "redrive-original-offset" in listed["u"]["problem"]
    assert listed["n"]["problem"] is None and listed["n"]["original"] is None

    selected = run_json("dlt", "ls", "-b", bootstrap, "--dlt-topic", dlt,
                        "--error-type", "DataException", "--error-type", "SerializationException")
    assert sorted(item["key"] for item in selected) == ["c", "t"]

    table = run_cli("dlt", "ls", "-b", bootstrap, "--dlt-topic", dlt)
    assert table.exit_code == 0
    assert "UNREADABLE" in table.stdout and "1 with unreadable headers" in table.stdout

    spring = run_cli("dlt", "show", "-b", bootstrap, "--dlt-topic", dlt, "0:0")
    assert spring.exit_code == 0
    assert "written by: spring" in spring.stdout
    assert "at com.shop.Billing.listen(Billing.java:42)" in spring.stdout
    assert "kafka_dlt-original-offset: 17\n" in spring.stdout  # Spring's binary long, decoded
    share = run_cli("dlt", "show", "-b", bootstrap, "--dlt-topic", dlt, "0:5")
    assert "written by: share-group" in share.stdout and "attempts:   5" in share.stdout
    unreadable = run_cli("dlt", "show", "-b", bootstrap, "--dlt-topic", dlt, "0:3")
    assert unreadable.exit_code == 0
    assert "UNREADABLE: malformed header redrive-original-offset" in unreadable.stdout
    assert "redrive-original-offset: minus one" in unreadable.stdout


def test_the_commands_take_their_connection_from_a_config_file(
        bootstrap: str, new_topic: NewTopic, tmp_path: Path) -> None:
    """A secured cluster's settings reach every client a command makes: here the broker list
    comes from the file alone, and a setting librdkafka refuses is one line naming it."""
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k", b"v", [(h.REASON, b"exhausted")])])
    settings = tmp_path / "client.properties"
    settings.write_text(f"# as Kafka's client.properties\nbootstrap.servers={bootstrap}\n"
                        "client.id=redrive-on-call\n")
    listed = run_json("dlt", "ls", "--config-file", str(settings), "--dlt-topic", dlt)
    assert [(row["key"], row["reason"]) for row in listed] == [("k", "exhausted")]
    result = run_cli("dlt", "ls", "--config-file", str(settings), "-X", "sasl.passwrd=hunter2",
                     "--dlt-topic", dlt)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: invalid sasl.passwrd='(hidden)': librdkafka has no setting of this name"]


def test_bad_input_is_one_line_and_publishes_nothing(bootstrap: str, new_topic: NewTopic,
                                                     unique_name: UniqueName) -> None:
    missing = unique_name("missing")
    dead = f"127.0.0.1:{free_port()}"
    topic = new_topic()
    before = topic_sizes(bootstrap, topic, "redrive.replays")
    cases = [
        (["dlt", "ls", "-b", bootstrap, "--dlt-topic", missing], f"unknown topic '{missing}'"),
        (["dlt", "ls", "-b", bootstrap, "--topic", missing, "--group", "g"],
         f"unknown topic '{missing}.g.dlt'"),
        (["dlt", "show", "-b", bootstrap, "--dlt-topic", topic, "0:5"], "holds no record there"),
        (["dlt", "show", "-b", bootstrap, "--dlt-topic", topic, "7"], "PARTITION:OFFSET"),
        (["dlt", "ls", "-b", bootstrap, "--dlt-topic", topic, "--since", "soon"],
         "invalid since='soon'"),
        (["dlt", "ls", "-b", bootstrap, "--dlt-topic", topic, "--reason", "exhaused"],
         "invalid reason='exhaused': expected one of exhausted, not-retryable"),
        (["dlt", "ls", "-b", bootstrap, "--dlt-topic", topic, "--partition", "7"],
         f"invalid partition=7: {topic} has partitions 0..0"),
        (["dlt", "ls", "-b", dead, "--timeout", "1", "--dlt-topic", topic],
         f"no Kafka broker reachable at bootstrap.servers='{dead}'"),
        (["dlt", "replay", "-b", dead, "--timeout", "1", "--dlt-topic", topic, "--to",
          "original"], "no Kafka broker reachable"),
        (["dlt", "replay", "-b", bootstrap, "--dlt-topic", missing, "--to", "original"],
         f"unknown topic '{missing}'"),
        (["dlt", "replay", "-b", bootstrap, "--dlt-topic", topic, "--to-topic", missing],
         f"unknown topic '{missing}'"),
        (["dlt", "replay", "-b", bootstrap, "--dlt-topic", topic, "--to", "original", "--rate",
          "fast"], "invalid rate='fast'"),
        (["stats", "-b", bootstrap, "--topic", missing, "--group", "g", "--window", "0"],
         f"unknown topic '{missing}'"),
        (["stats", "-b", dead, "--timeout", "1", "--topic", topic, "--group", "g"],
         "no Kafka broker reachable"),
    ]
    for args, message in cases:
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])
        assert "Traceback" not in result.output
    assert topic_sizes(bootstrap, topic, "redrive.replays") == before
    usage = run_cli("dlt", "ls", "-b", bootstrap)
    assert usage.exit_code == 2 and "give --topic and --group, or --dlt-topic" in usage.output
    assert json.loads(run_cli("dlt", "ls", "-b", bootstrap, "--dlt-topic", topic,
                              "--json").stdout) == []
