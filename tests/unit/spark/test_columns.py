"""The `redrive` column as the source's reader decodes it from each Arrow batch's headers."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type

from redrive import headers as h
from redrive.errors import MalformedHeader
from redrive.spark import columns
from redrive.spark.columns import FIELDS, arrow_type, with_redrive_column
from redrive.spark.options import HEADERS_TYPE

HEADER_CASES: list[list[tuple[str, bytes]]] = [
    [],
    [("other", b"1")],
    [(h.ATTEMPT, b"2"), (h.DUE, b"1700000000000"), (h.GROUP, b"g"), (h.ORIGINAL_TOPIC, b"t"),
     (h.ORIGINAL_PARTITION, b"1"), (h.ORIGINAL_OFFSET, b"5"), (h.ORIGINAL_TIMESTAMP, b"17"),
     (h.FIRST_FAILURE, b"1699999999000"), (h.TARGET, b"main")],
    [(h.ATTEMPT, b"x")],
    [(h.ATTEMPT, b"1"), (h.ATTEMPT, b"3")],
    [(h.ATTEMPT, b"-1")],
    [(h.ATTEMPT, b" 4 ")],
    [(h.ORIGINAL_TOPIC, b"t")],
    [(h.ORIGINAL_TOPIC, b""), (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"0")],
    [(h.GROUP, b"")],
    [(h.GROUP, b"\xff")],
    [(h.TARGET, b"")],
    [(h.DUE, b"12345678901234567890123")],
    [(h.FIRST_FAILURE, b"1.5")],
    [("other", b"x"), (h.ATTEMPT, b"2")],
    # Within 19 digits, yet past what its column holds: each failed the whole task before.
    [(h.ATTEMPT, b"2147483648")],
    [(h.ORIGINAL_TOPIC, b"t"), (h.ORIGINAL_PARTITION, b"99999999999"), (h.ORIGINAL_OFFSET, b"0")],
    [(h.ORIGINAL_TOPIC, b"t"), (h.ORIGINAL_PARTITION, b"0"),
     (h.ORIGINAL_OFFSET, b"9223372036854775808")],
    [(h.DUE, b"9999999999999999")],
    [(h.FIRST_FAILURE, b"9999999999999999999")],
    # Unreadable, but whose it is can be read: the other groups skip it.
    [(h.GROUP, b"billing"), (h.ATTEMPT, b"many")],
    # The largest values each holds.
    [(h.ATTEMPT, b"2147483647"), (h.DUE, b"253402300799999"), (h.ORIGINAL_TOPIC, b"t"),
     (h.ORIGINAL_PARTITION, b"2147483647"), (h.ORIGINAL_OFFSET, b"9223372036854775807"),
     (h.ORIGINAL_TIMESTAMP, b"253402300799999")],
]


def batch_of(cases: list[list[tuple[str, bytes]]]) -> pa.RecordBatch:
    headers = pa.array([[{"key": k, "value": v} for k, v in pairs] for pairs in cases],
                       to_arrow_type(HEADERS_TYPE))
    return pa.RecordBatch.from_arrays([pa.array(range(len(cases)), pa.int64()), headers],
                                      names=["offset", "headers"])


def expected(pairs: list[tuple[str, bytes]]) -> dict[str, Any]:
    try:
        delivery = h.read_delivery(pairs)
    except MalformedHeader as exc:
        return {**dict.fromkeys(FIELDS), "attempt": 0, "malformed": str(exc),
                "group": h.readable_group(pairs)}
    origin = delivery.original

    def micros(ms: int | None) -> int | None:
        return None if ms is None else ms * 1000

    return {"attempt": delivery.attempt, "first_failure": micros(delivery.first_failure_ms),
            "original_topic": origin.topic if origin else None,
            "original_partition": origin.partition if origin else None,
            "original_offset": origin.offset if origin else None,
            "original_timestamp": micros(origin.timestamp_ms) if origin else None,
            "due": micros(delivery.due_ms), "group": delivery.group,
            "target": delivery.target, "malformed": None}


def test_each_row_decodes_as_read_delivery_reads_its_headers() -> None:
    decoded = with_redrive_column(batch_of(HEADER_CASES), arrow_type())
    assert decoded.schema.names == ["offset", "headers", "redrive"]
    assert decoded.column("offset").to_pylist() == list(range(len(HEADER_CASES)))
    rows = decoded.column("redrive").cast(pa.struct([
        (name, pa.int64() if kind.type.id == pa.timestamp("us").id else kind.type)
        for name, kind in ((f.name, f) for f in arrow_type())])).to_pylist()
    for pairs, got in zip(HEADER_CASES, rows, strict=True):
        assert got == expected(pairs), pairs
    malformed = [row["malformed"] for row in rows]
    assert sum(m is not None for m in malformed) == 15
    assert rows[-2]["group"] == "billing" and rows[-2]["malformed"] is not None
    assert malformed[16] == ("malformed header redrive-original-partition=b'99999999999': must "
                             "be at most 2147483647")
    assert rows[-1]["due"] == 253_402_300_799_999_000 and rows[-1]["malformed"] is None
    assert malformed[3] == "malformed header redrive-attempt=b'x': expected a decimal integer"
    assert rows[4]["attempt"] == 3  # the last value wins
    assert rows[2]["due"] == 1_700_000_000_000_000 and rows[2]["original_partition"] == 1


def test_a_batch_without_redrive_headers_is_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pairs: Any) -> Any:
        raise AssertionError(f"decoded {pairs}")

    monkeypatch.setattr(columns.h, "read_delivery", refuse)
    decoded = with_redrive_column(batch_of([[], [("other", b"1")], []] * 1000), arrow_type())
    column = decoded.column("redrive")
    assert column.type == arrow_type() and len(column) == 3000
    assert set(column.field("attempt").to_pylist()) == {0}
    assert all(column.field(name).null_count == 3000 for name in FIELDS[1:])
    # one tagged row: only it is decoded
    seen: list[Any] = []
    monkeypatch.setattr(columns.h, "read_delivery",
                        lambda pairs: seen.append(pairs) or h.read_delivery_python(pairs))
    decoded = with_redrive_column(batch_of([[], [(h.ATTEMPT, b"4")], []]), arrow_type())
    assert seen == [[(h.ATTEMPT, b"4")]]
    assert decoded.column("redrive").field("attempt").to_pylist() == [0, 4, 0]
