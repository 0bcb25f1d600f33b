"""The three readers of a partition range - the fetch-protocol one (redrive.spark._fetchread),
the C one over librdkafka (redrive.spark._rangeread) and the confluent-kafka loop - give the same
Arrow batches on the same records, and fail alike. No Spark needed: executors call read_range, and
so do these tests."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition

from redrive import kafka
from redrive.kafka.ranges import RangeReadFailed
from redrive.spark.options import (
    SourceOptionError,
    SourceOptions,
    fetch_reader_built,
    native_reader_built,
)
from redrive.spark.readers import KafkaRange, read_range

from ..records import input_producer, produce_input
from .conftest import produce_transactions

pytestmark = pytest.mark.integration

READERS = ("fetch", "native", "python")
HANDED_OFF = "read by the client library"


def options(bootstrap: str, topic: str, reader: str, **extra: str) -> SourceOptions:
    return SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                "redrive.reader": reader, **extra})


def read(bootstrap: str, part: KafkaRange, reader: str, **extra: str) -> pa.Table:
    batches = list(read_range(options(bootstrap, part.topic, reader, **extra), part))
    assert batches, "a non-empty range gives at least one batch"
    return pa.Table.from_batches(batches)


def closed_address() -> str:
    """An address on which nothing listens."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{closed.getsockname()[1]}"


def test_the_c_readers_are_built_by_the_install() -> None:
    # The Makefile installs librdkafka-dev before pip builds the extensions; without them the
    # source would quietly fall back to the slower readers.
    assert native_reader_built()
    assert fetch_reader_built()
    chosen = options("x:1", "t", "auto")
    assert chosen.fetch and chosen.native


def test_the_fetch_reader_is_left_out_where_it_cannot_serve_the_settings() -> None:
    for setting, value in (("security.protocol", "SASL_SSL"), ("check.crcs", "true"),
                           ("client.rack", "eu-1a")):
        chosen = options("x:1", "t", "auto", **{f"kafka.{setting}": value})
        assert not chosen.fetch and chosen.native
        with pytest.raises(SourceOptionError, match=rf"redrive\.reader.*fetch.*{setting}"):
            options("x:1", "t", "fetch", **{f"kafka.{setting}": value})
    assert not options("x:1", "t", "native").fetch
    assert not options("x:1", "t", "python").fetch
    with pytest.raises(SourceOptionError, match="expected auto, fetch, native or python"):
        options("x:1", "t", "fast")


def test_both_readers_give_the_same_batches(bootstrap: str, new_topic: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from redrive.spark import readers

    monkeypatch.setattr(readers, "ARROW_BATCH_ROWS", 1_000)  # a range spans several batches
    topic = new_topic(2)
    # Recent create times: records older than the topic's retention (7 days by default) are
    # deleted by the broker, and a read of them then fails as it should.
    base_ms = int(time.time() * 1000) - 60_000
    records = []
    for i in range(6_000):
        # Null keys, null values, no headers, several headers, a header with a null value.
        header_list: list[tuple[str, Any]] = [
            [], [("a", b"x%d" % i), ("empty", b""), ("none", None)], [("redrive-attempt", b"1")],
        ][i % 3]
        records.append(kafka.OutRecord(topic, None if i % 7 == 0 else b"v%d" % i,
                                       None if i % 5 == 0 else b"k%d" % i, header_list,
                                       partition=i % 2, timestamp_ms=base_ms + i))
    produce_input(bootstrap, records)
    for include_headers in ("true", "false"):
        for partition in (0, 1):
            part = KafkaRange(topic, partition, 17, 2_900)
            fetch, native, python = (read(bootstrap, part, reader, includeHeaders=include_headers)
                                     for reader in READERS)
            assert fetch.num_rows == native.num_rows == python.num_rows == 2_900 - 17
            assert fetch.schema == native.schema == python.schema
            assert native.equals(python)
            assert fetch.equals(python)
            assert fetch.column("offset").to_pylist() == list(range(17, 2_900))
    for reader in ("fetch", "native"):
        first = read(bootstrap, KafkaRange(topic, 0, 0, 3), reader, includeHeaders="true")
        assert first.to_pylist()[:2] == [
        {"key": None, "value": None, "topic": topic, "partition": 0, "offset": 0,
         "timestamp": first.column("timestamp")[0].as_py(), "timestampType": 0, "headers": None},
            {"key": b"k2", "value": b"v2", "topic": topic, "partition": 0, "offset": 1,
             "timestamp": first.column("timestamp")[1].as_py(), "timestampType": 0,
             "headers": [{"key": "redrive-attempt", "value": b"1"}]},
        ]
        assert first.column("timestamp")[1].value == (base_ms + 2) * 1000  # us


@pytest.mark.parametrize("reader", ["fetch", "native"])
def test_the_c_readers_end_a_batch_at_its_byte_bound(bootstrap: str, new_topic: Any,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     reader: str) -> None:
    # (The confluent-kafka loop checks the bound only between consume() calls.)
    from redrive.spark import readers

    topic = new_topic(1)
    produce_input(bootstrap, [
        kafka.OutRecord(topic, bytes([i]) * 100_000) for i in range(30)])
    monkeypatch.setattr(readers, "ARROW_BATCH_BYTES", 1_000_000)
    batches = list(read_range(options(bootstrap, topic, reader), KafkaRange(topic, 0, 0, 30)))
    assert [b.num_rows for b in batches] == [10, 10, 10]
    assert [bytes(v) for b in batches for v in b.column("value").to_pylist()] == \
        [bytes([i]) * 100_000 for i in range(30)]


@pytest.mark.parametrize("reader", READERS)
def test_read_committed_ends_on_the_last_marker(bootstrap: str, new_topic: Any,
                                                unique_name: Any, reader: str) -> None:
    topic = new_topic(1)
    produce_transactions(bootstrap, topic, unique_name("tx"),
                         [(["c0", "c1"], True), (["a0", "a1"], False)])
    # c0 c1 marker a0 a1 marker: the range's last three offsets are never delivered.
    table = read(bootstrap, KafkaRange(topic, 0, 0, 6), reader,
                 **{"kafkaConsumer.pollTimeoutMs": "10000"})
    assert table.column("value").to_pylist() == [b"c0", b"c1"]


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_aborted_transactions_are_left_out_alike(bootstrap: str, new_topic: Any,
                                                 unique_name: Any, isolation: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # Two producers' transactions, committed and aborted, between plain records: under
    # read_committed the aborted ones are dropped by the answer's list of aborted transactions
    # and the markers, under read_uncommitted every data record is read.
    topic = new_topic(1)
    plain = input_producer(bootstrap)
    kafka.produce_confirmed(plain, [kafka.OutRecord(topic, b"p0")])
    produce_transactions(bootstrap, topic, unique_name("tx-a"),
                         [(["a0", "a1"], False), (["a2"], True)])
    kafka.produce_confirmed(plain, [kafka.OutRecord(topic, b"p1")])
    produce_transactions(bootstrap, topic, unique_name("tx-b"),
                         [(["b0"], True), (["b1", "b2", "b3"], False), (["b4"], True)])
    end = kafka.watermarks(kafka.consumer(bootstrap), topic, 0)[1]
    with caplog.at_level(logging.INFO, logger="redrive.spark.readers"):
        tables = {reader: read(bootstrap, KafkaRange(topic, 0, 0, end), reader,
                               **{"kafka.isolation.level": isolation,
                                  "kafkaConsumer.pollTimeoutMs": "10000"})
                  for reader in READERS}
    assert not [r for r in caplog.records if HANDED_OFF in r.getMessage()]
    expected = ([b"p0", b"a2", b"p1", b"b0", b"b4"] if isolation == "read_committed" else
                [b"p0", b"a0", b"a1", b"a2", b"p1", b"b0", b"b1", b"b2", b"b3", b"b4"])
    assert tables["fetch"].column("value").to_pylist() == expected
    assert tables["fetch"].equals(tables["python"])
    assert tables["native"].equals(tables["python"])


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_the_fetch_reader_hands_a_compressed_batch_to_the_client_library(
        bootstrap: str, new_topic: Any, caplog: pytest.LogCaptureFixture, codec: str) -> None:
    # Uncompressed records, then compressed ones: the fetch reader reads the first part and
    # hands the range on at the first compressed batch, and no record is lost or read twice.
    topic = new_topic(1)
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"plain%d" % i) for i in range(50)])
    kafka.produce_confirmed(kafka.producer(bootstrap, overrides={"compression.type": codec}),
                            [kafka.OutRecord(topic, b"packed%d" % i) for i in range(50)])
    with caplog.at_level(logging.INFO, logger="redrive.spark.readers"):
        fetched = read(bootstrap, KafkaRange(topic, 0, 3, 100), "fetch")
    assert fetched.column("offset").to_pylist() == list(range(3, 100))
    assert fetched.equals(read(bootstrap, KafkaRange(topic, 0, 3, 100), "python"))
    handoffs = [r.getMessage() for r in caplog.records if HANDED_OFF in r.getMessage()]
    assert len(handoffs) == 1
    assert f"{topic}[0]: offsets 50 to 99 {HANDED_OFF}: a compressed record batch" in handoffs[0]


def test_the_fetch_reader_finds_the_leader_and_skips_a_dead_bootstrap_server(
        bootstrap: str, new_topic: Any, caplog: pytest.LogCaptureFixture) -> None:
    # The first bootstrap server refuses; the second is named "localhost", while the broker
    # gives its leader's address as 127.0.0.1: the reader connects on to that address.
    topic = new_topic(1)
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"v%d" % i) for i in range(20)])
    port = bootstrap.rsplit(":", 1)[1]
    with caplog.at_level(logging.INFO, logger="redrive.spark.readers"):
        table = read(f"{closed_address()},localhost:{port}", KafkaRange(topic, 0, 0, 20),
                     "fetch")
    assert table.column("value").to_pylist() == [b"v%d" % i for i in range(20)]
    assert not [r for r in caplog.records if HANDED_OFF in r.getMessage()]


@pytest.mark.parametrize("reader", READERS)
def test_a_range_past_the_end_fails_naming_the_offset(bootstrap: str, new_topic: Any,
                                                      reader: str) -> None:
    topic = new_topic(1)
    produce_input(bootstrap, [kafka.OutRecord(topic, b"only")])
    with pytest.raises(RangeReadFailed, match=r"stuck at offset 1 for 1\.0s"):
        list(read_range(options(bootstrap, topic, reader,
                                **{"kafkaConsumer.pollTimeoutMs": "1000"}),
                        KafkaRange(topic, 0, 0, 5)))


@pytest.mark.parametrize("reader", READERS)
def test_a_broker_gone_under_a_read_is_named_in_its_error(reader: str) -> None:
    # The driver planned the range; by the time the executor reads it no broker answers.
    address = closed_address()
    with pytest.raises(RangeReadFailed) as failed:
        list(read_range(options(address, "gone", reader,
                                **{"kafkaConsumer.pollTimeoutMs": "2000"}),
                        KafkaRange("gone", 0, 0, 5)))
    assert "stuck at offset 0 for 2.0s" in str(failed.value)
    assert f"the client's last error: {address}" in str(failed.value)
    assert "Connection refused" in str(failed.value)


@pytest.mark.parametrize("reader", READERS)
def test_records_deleted_under_a_read_fail_it_rather_than_being_skipped(
        bootstrap: str, new_topic: Any, reader: str) -> None:
    # The driver planned [0, 10); the records below 4 were deleted before the executor read.
    # A consumer left to auto.offset.reset would jump to 4 and return six rows as if whole.
    topic = new_topic(1)
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"v%d" % i) for i in range(10)])
    admin = kafka.admin(bootstrap)  # kept: the futures need their client alive
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    with pytest.raises(RangeReadFailed, match="offsets 0 to 3 are gone from the broker"):
        list(read_range(options(bootstrap, topic, reader), KafkaRange(topic, 0, 0, 10)))
    # With failOnDataLoss=false the read goes on from what is left, as Spark's source does.
    kept = read(bootstrap, KafkaRange(topic, 0, 0, 10), reader, failOnDataLoss="false")
    assert kept.column("offset").to_pylist() == list(range(4, 10))


def test_a_bad_client_setting_is_named(bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(1)
    with pytest.raises(SourceOptionError, match=r"fetch\.min\.bytes=lots.*redrive\.reader=python"):
        list(read_range(options(bootstrap, topic, "native", **{"kafka.fetch.min.bytes": "lots"}),
                        KafkaRange(topic, 0, 0, 1)))
