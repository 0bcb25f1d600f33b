"""A header whose value is null: every reader of the source shows it null (not empty), and a
pipeline's dead-letter copy keeps it null, in both forms. Before, routing made it empty."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from redrive import headers as h
from redrive import kafka
from redrive.spark import RetryPipeline
from redrive.spark.options import SourceOptions
from redrive.spark.readers import KafkaRange, read_range
from redrive.spark.sql import functions

from . import pipeline_jobs
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.integration

HEADERS: list[tuple[str, bytes | None]] = [("trace-flag", None), ("empty", b""), ("plain", b"1")]


def produce(bootstrap: str, topic: str) -> None:
    kafka.produce_confirmed(kafka.producer(bootstrap), [
        kafka.OutRecord(topic, value, None, HEADERS, 0) for value in (b"ok", b"bad")])


@pytest.mark.parametrize("reader", ["fetch", "native", "python"])
def test_every_reader_shows_a_null_value_as_null(bootstrap: str, new_topic: Any,
                                                 reader: str) -> None:
    topic = new_topic()
    produce(bootstrap, topic)
    options = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                   "redrive.reader": reader, "includeHeaders": "true"})
    rows = pa.Table.from_batches(list(read_range(options, KafkaRange(topic, 0, 0, 2))))
    assert [row["headers"] for row in rows.to_pylist()] == [
        [{"key": name, "value": value} for name, value in HEADERS]] * 2


class ParseError(Exception):
    """Not retryable under pipeline_jobs.POLICY, which knows it by name; defined here, since
    this module is pickled by value and pipeline_jobs is not importable on the executors."""


def fails_bad(record: Any) -> dict[str, Any]:
    if record["value"] == b"bad":
        raise ParseError("bad")
    return {"value": record["value"]}


@pytest.mark.spark
@pytest.mark.parametrize("form", ["transform", "function"])
def test_a_pipelines_dead_letter_copy_keeps_a_null_value_null(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        form: str) -> None:
    topic = new_topic(1)
    group = unique_name(f"nulls-{form}")
    produce(bootstrap, topic)

    def transform(frame: Any) -> Any:
        F = functions(frame)
        error = F.when(F.col("value") == F.lit(b"bad"), F.struct(
            F.lit("ParseError").alias("type"), F.lit("bad").alias("message")))
        return frame.select("topic", "partition", "offset", "value", error.alias("error"))

    shape: dict[str, Any] = ({"transform": transform} if form == "transform" else
                             {"function": fails_bad, "output_schema": "value binary"})
    stats = RetryPipeline(spark, bootstrap, topic, group, pipeline_jobs.POLICY,
                          sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                          trigger_interval="200 milliseconds", **shape,
                          ).run(until=lambda s: s.finished >= 2, timeout_s=120)
    assert stats.dead_lettered_by_reason == {"not-retryable": 1}
    [dead] = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert dead.value() == b"bad"
    assert [(name, value) for name, value in dead.headers() or []
            if not name.startswith(h.PREFIX)] == HEADERS
