"""A header whose value is null: every reader of the source shows it null, not empty (a
pipeline's copy of such a record is checked in test_unreadable_header_names.py, whose pipeline
run it shares)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from redrive import kafka
from redrive.spark.options import SourceOptions
from redrive.spark.readers import KafkaRange, read_range

from ..records import produce_input

pytestmark = pytest.mark.integration

HEADERS: list[tuple[str, bytes | None]] = [("trace-flag", None), ("empty", b""), ("plain", b"1")]


def produce(bootstrap: str, topic: str) -> None:
    produce_input(bootstrap, [
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
