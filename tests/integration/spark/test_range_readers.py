"""The two readers of a partition range, the C one (redrive._rangeread) and the confluent-kafka
loop, give the same Arrow batches on the same records, and fail alike. No Spark needed: executors
call read_range, and so do these tests."""

from __future__ import annotations

import socket
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition

from redrive import kafka
from redrive.spark.source import (
    KafkaRange,
    KafkaReadFailed,
    SourceOptionError,
    SourceOptions,
    native_reader_built,
    read_range,
)

from .conftest import produce_transactions

pytestmark = pytest.mark.integration

READERS = ("native", "python")


def options(bootstrap: str, topic: str, reader: str, **extra: str) -> SourceOptions:
    return SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                "redrive.reader": reader, **extra})


def read(bootstrap: str, part: KafkaRange, reader: str, **extra: str) -> pa.Table:
    batches = list(read_range(options(bootstrap, part.topic, reader, **extra), part))
    assert batches, "a non-empty range gives at least one batch"
    return pa.Table.from_batches(batches)


def test_the_native_reader_is_built_by_the_install() -> None:
    # The Makefile installs librdkafka-dev before pip builds the extension; without it the
    # source would quietly fall back to the slower reader.
    assert native_reader_built()
    assert options("x:1", "t", "auto").native


def test_both_readers_give_the_same_batches(bootstrap: str, new_topic: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from redrive.spark import source

    monkeypatch.setattr(source, "ARROW_BATCH_ROWS", 1_000)  # a range spans several batches
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
    kafka.produce_confirmed(kafka.producer(bootstrap), records)
    for include_headers in ("true", "false"):
        for partition in (0, 1):
            part = KafkaRange(topic, partition, 17, 2_900)
            native, python = (read(bootstrap, part, reader, includeHeaders=include_headers)
                              for reader in READERS)
            assert native.num_rows == python.num_rows == 2_900 - 17
            assert native.schema == python.schema
            assert native.equals(python)
            assert native.column("offset").to_pylist() == list(range(17, 2_900))
    first = read(bootstrap, KafkaRange(topic, 0, 0, 3), "native", includeHeaders="true")
    assert first.to_pylist()[:2] == [
        {"key": None, "value": None, "topic": topic, "partition": 0, "offset": 0,
         "timestamp": first.column("timestamp")[0].as_py(), "timestampType": 0, "headers": None},
        {"key": b"k2", "value": b"v2", "topic": topic, "partition": 0, "offset": 1,
         "timestamp": first.column("timestamp")[1].as_py(), "timestampType": 0,
         "headers": [{"key": "redrive-attempt", "value": b"1"}]},
    ]
    assert first.column("timestamp")[1].value == (base_ms + 2) * 1000  # us


def test_the_native_reader_ends_a_batch_at_its_byte_bound(bootstrap: str, new_topic: Any,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # (The confluent-kafka loop checks the bound only between consume() calls.)
    from redrive.spark import source

    topic = new_topic(1)
    kafka.produce_confirmed(kafka.producer(bootstrap), [
        kafka.OutRecord(topic, bytes([i]) * 100_000) for i in range(30)])
    monkeypatch.setattr(source, "ARROW_BATCH_BYTES", 1_000_000)
    batches = list(read_range(options(bootstrap, topic, "native"), KafkaRange(topic, 0, 0, 30)))
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


@pytest.mark.parametrize("reader", READERS)
def test_a_range_past_the_end_fails_naming_the_offset(bootstrap: str, new_topic: Any,
                                                      reader: str) -> None:
    topic = new_topic(1)
    kafka.produce_confirmed(kafka.producer(bootstrap), [kafka.OutRecord(topic, b"only")])
    with pytest.raises(KafkaReadFailed, match=r"stuck at offset 1 for 1\.0s"):
        list(read_range(options(bootstrap, topic, reader,
                                **{"kafkaConsumer.pollTimeoutMs": "1000"}),
                        KafkaRange(topic, 0, 0, 5)))


@pytest.mark.parametrize("reader", READERS)
def test_a_broker_gone_under_a_read_is_named_in_its_error(reader: str) -> None:
    # The driver planned the range; by the time the executor reads it no broker answers.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(KafkaReadFailed) as failed:
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
    kafka.produce_confirmed(kafka.producer(bootstrap),
                            [kafka.OutRecord(topic, b"v%d" % i) for i in range(10)])
    admin = kafka.admin(bootstrap)  # kept: the futures need their client alive
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    with pytest.raises(KafkaReadFailed, match="offsets 0 to 3 are gone from the broker"):
        list(read_range(options(bootstrap, topic, reader), KafkaRange(topic, 0, 0, 10)))
    # With failOnDataLoss=false the read goes on from what is left, as Spark's source does.
    kept = read(bootstrap, KafkaRange(topic, 0, 0, 10), reader, failOnDataLoss="false")
    assert kept.column("offset").to_pylist() == list(range(4, 10))


def test_a_bad_client_setting_is_named(bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(1)
    with pytest.raises(SourceOptionError, match=r"fetch\.min\.bytes=lots.*redrive\.reader=python"):
        list(read_range(options(bootstrap, topic, "native", **{"kafka.fetch.min.bytes": "lots"}),
                        KafkaRange(topic, 0, 0, 1)))
