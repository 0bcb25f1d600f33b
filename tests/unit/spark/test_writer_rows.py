"""The rows write_to_kafka's tasks turn into records: what each column becomes."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from redrive.spark import writer

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def batch(headers: Sequence[object]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([b"v"] * len(headers), pa.binary()), pa.array(headers, HEADERS)],
        names=["value", "headers"])


def test_headers_keep_their_names_order_and_bytes() -> None:
    rows = [[{"key": "a", "value": b"\x00\xff"}, {"key": "a", "value": b""}], None, []]
    records = list(writer._records(iter([batch(rows)]), "out"))
    assert [list(record.headers) for record in records] == [[("a", b"\x00\xff"), ("a", b"")],
                                                            [], []]
    assert {record.topic for record in records} == {"out"}


def test_a_header_without_a_name_is_refused_naming_the_column() -> None:
    rows = [[{"key": "a", "value": b"1"}], [{"key": None, "value": b"2"}]]
    with pytest.raises(writer.WriterInputError, match=r"column headers='key=None'.*null key"):
        list(writer._records(iter([batch(rows)]), "out"))
