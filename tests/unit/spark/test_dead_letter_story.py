"""The story columns of `dead_letters`: other systems' headers are read leniently, so a number
outside its column becomes null with the reason in `problem`, and the batch still decodes."""

from __future__ import annotations

import pyarrow as pa

from redrive.spark.dead_letter_table import SCHEMA, DecodeDeadLetters, story

SPRING_WIDE = [
    ("kafka_dlt-original-topic", b"orders"),
    ("kafka_dlt-original-partition", b"\x7f" + b"\xff" * 7),  # 8 bytes where Spring writes 4
    ("kafka_dlt-original-offset", (42).to_bytes(8, "big")),
    ("kafka_dlt-original-timestamp", b"\x7f" + b"\xff" * 7),
    ("kafka_dlt-exception-fqcn", b"com.example.Boom"),
]
CONNECT = [("__connect.errors.topic", b"orders"), ("__connect.errors.partition", b"3"),
           ("__connect.errors.offset", b"9" * 30),
           ("__connect.errors.exception.class.name", b"E")]


def test_numbers_outside_their_columns_become_null_and_say_why() -> None:
    spring = story(SPRING_WIDE)
    assert (spring["original_partition"], spring["original_offset"]) == (None, 42)
    assert spring["original_timestamp"] is None
    assert spring["problem"] == ("original_partition 9223372036854775807 is out of range; "
                                 "original_timestamp 9223372036854775807 ms is out of range")
    connect = story(CONNECT)
    assert (connect["original_partition"], connect["original_offset"]) == (3, None)
    assert connect["problem"] == f"original_offset {'9' * 30} is out of range"


def test_a_batch_with_such_records_decodes() -> None:
    kind = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = [SPRING_WIDE, CONNECT, [("other", b"x")]]
    batch = pa.RecordBatch.from_pydict({
        "topic": ["orders.g.dlt"] * 3, "partition": [0, 0, 1], "offset": [5, 6, 7],
        "timestamp": pa.array([1_700_000_000_000_000] * 3, pa.timestamp("us", tz="UTC")),
        "key": pa.array([None, b"k", None], pa.binary()), "value": [b"v"] * 3,
        "headers": pa.array([[{"key": k, "value": v} for k, v in pairs] for pairs in rows], kind),
    })
    decoded = DecodeDeadLetters("orders", "g").decode(batch)
    assert decoded.schema == SCHEMA
    assert decoded.column("system").to_pylist() == ["spring", "connect", None]
    assert decoded.column("dlt_offset").to_pylist() == [5, 6, 7]
    assert [p is not None for p in decoded.column("problem").to_pylist()] == [True, True, False]
