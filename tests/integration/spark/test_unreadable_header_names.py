"""A record whose header name is not UTF-8 (any librdkafka producer can write one; confluent-kafka
cannot decode it): every reader of the source delivers it alike, its name shown with U+FFFD and
`redrive.malformed` saying why, and the driver's gate scan, the ledger and the dead-letter table
read past it. And a header whose value is null: a pipeline's copy keeps it null."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from redrive import headers as h
from redrive import kafka, topics
from redrive.kafka.ranges import PartitionRange, read_ranges
from redrive.spark import RetryPipeline, dead_letters, ledger, planning, readers
from redrive.spark.options import SourceOptions
from redrive.spark.readers import KafkaRange, read_range
from redrive.spark.sql import functions

from ..records import produce_input
from . import pipeline_jobs  # its policy
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.integration

BAD_NAME = b"bad\xffname"
NULL_HEADERS: list[tuple[str, bytes | None]] = [("trace-flag", None), ("empty", b""),
                                                ("plain", b"1")]
SHOWN = "bad\ufffdname"


def produce_bad(bootstrap: str, topic: str) -> None:
    """Offsets 0 (plain), 1 (a name not UTF-8 between readable headers), 2 (readable headers)."""
    bad = (BAD_NAME + b"=x").decode("utf-8", "surrogateescape")
    for value, headers in ((b"a", []), (b"b", ["first=1", bad, "redrive-attempt=2"]),
                           (b"c", ["last=3"])):
        command = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0"]
        for header in headers:
            command += ["-H", header]
        subprocess.run(command, input=value, check=True, timeout=30)


def read(bootstrap: str, topic: str, reader: str) -> list[dict[str, Any]]:
    options = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                   "redrive.reader": reader, "includeHeaders": "true",
                                   "redrive.decodeHeaders": "true"})
    rows = pa.Table.from_batches(list(read_range(options, KafkaRange(topic, 0, 0, 3))))
    return [{"headers": row["headers"], "malformed": row["redrive"]["malformed"]}
            for row in rows.to_pylist()]


@pytest.mark.parametrize("reader", ["fetch", "native", "python"])
def test_every_reader_shows_the_name_with_u_fffd_and_the_record_as_malformed(
        bootstrap: str, new_topic: Any, reader: str) -> None:
    topic = new_topic()
    produce_bad(bootstrap, topic)
    rows = read(bootstrap, topic, reader)
    assert [row["headers"] for row in rows] == [
        None,
        [{"key": "first", "value": b"1"}, {"key": SHOWN, "value": b"x"},
         {"key": "redrive-attempt", "value": b"2"}],
        [{"key": "last", "value": b"3"}],
    ]
    assert rows[0]["malformed"] is None and rows[2]["malformed"] is None
    assert "not UTF-8" in rows[1]["malformed"] and SHOWN in rows[1]["malformed"]


def test_the_python_reader_without_librdkafka_shows_the_name_it_knows(
        bootstrap: str, new_topic: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = new_topic()
    produce_bad(bootstrap, topic)
    monkeypatch.setattr(readers, "native_reader_built", lambda: False)
    rows = read(bootstrap, topic, "python")
    assert rows[1]["headers"] == [{"key": SHOWN, "value": None}]
    assert "not UTF-8" in rows[1]["malformed"]
    assert rows[2]["headers"] == [{"key": "last", "value": b"3"}]


def test_the_gate_scan_and_the_ledger_read_past_it(bootstrap: str, new_topic: Any) -> None:
    topic = new_topic()
    produce_bad(bootstrap, topic)
    messages = list(read_ranges(bootstrap, [PartitionRange(topic, 0, 0, 3)], idle_s=10))
    # Due now: held, it would stall its partition; read, it is dead-lettered as malformed.
    assert [planning._due(message) for message in messages] == [None, None, None]
    assert ledger.copies_since(bootstrap, {f"{topic}:0": 0}, "billing") == set()


def test_dead_letters_lists_it_with_a_problem(bootstrap: str, new_topic: Any,
                                             unique_name: Any, spark: Any) -> None:
    main = unique_name("orders")
    topic = new_topic(name=topics.dead_letter_name(main, "billing"))
    produce_bad(bootstrap, topic)
    rows = dead_letters(spark, bootstrap, main, "billing").orderBy("dlt_offset").collect()
    assert [row["value"] for row in rows] == [b"a", b"b", b"c"]
    assert rows[0]["problem"] is None and rows[2]["problem"] is None
    assert "not UTF-8" in rows[1]["problem"] and SHOWN in rows[1]["problem"]
    assert kafka.topic_partitions(kafka.admin(bootstrap))[topic] == 1


class ParseError(Exception):
    """Not retryable under pipeline_jobs.POLICY, which knows it by name; defined here, since
    this module is pickled by value and pipeline_jobs is not importable on the executors."""


def fails_d(record: Any) -> dict[str, Any]:
    if record["value"] == b"d":
        raise ParseError("d")
    return {"value": record["value"]}


def fails_d_as_a_column(frame: Any) -> Any:
    F = functions(frame)
    error = F.when(F.col("value") == F.lit(b"d"), F.struct(
        F.lit("ParseError").alias("type"), F.lit("d").alias("message")))
    return frame.select("topic", "partition", "offset", "value", error.alias("error"))


@pytest.mark.spark
@pytest.mark.parametrize("form", ["transform", "function"])
def test_a_pipeline_dead_letters_it_as_malformed_and_writes_the_others(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        form: str) -> None:
    """Also (one pipeline run costs the Spark worker about 15 s): a record carrying a header
    whose value is null fails, and its dead-letter copy keeps the value null (before, routing
    made it empty)."""
    topic = new_topic(1)
    group = unique_name(f"names-{form}")
    produce_bad(bootstrap, topic)
    produce_input(bootstrap, [
        kafka.OutRecord(topic, b"d", None, NULL_HEADERS, 0)])
    shape: dict[str, Any] = (
        {"transform": fails_d_as_a_column} if form == "transform" else
        {"function": fails_d, "output_schema": "value binary"})
    stats = RetryPipeline(spark, bootstrap, topic, group, pipeline_jobs.POLICY,
                          sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                          trigger_interval="200 milliseconds", **shape,
                          ).run(until=lambda s: s.finished >= 4, timeout_s=120)
    assert stats.dead_lettered_by_reason == {"malformed": 1, "not-retryable": 1}
    written = spark.read.parquet(str(tmp_path / "out")).select("value").collect()
    assert sorted(bytes(row["value"]) for row in written) == [b"a", b"c"]
    dead, null = sorted(read_all(bootstrap, f"{topic}.{group}.dlt"), key=lambda m: m.value())
    assert dead.value() == b"b"
    headers = dict(kafka.message_headers(dead))
    assert headers[h.REASON] == b"malformed"
    assert b"not UTF-8" in headers[h.ERROR_MESSAGE]
    assert null.value() == b"d"
    assert [(name, value) for name, value in null.headers() or []
            if not name.startswith(h.PREFIX)] == NULL_HEADERS
