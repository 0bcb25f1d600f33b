"""The `redrive` column: redrive's headers decoded as the source reads each batch.

The DataFrame form must not run Python per record in Spark's own plan, and decoding the headers
there, in Spark SQL, was one of a batch's largest costs: the expression compiled to more
bytecode than the JVM compiles in one method (8,000 bytes), so the stage holding it ran
interpreted, about 2 µs a record whether a record carried redrive headers or not (1M records
read in 3.6 s with the column against 1.5 s without it). The source's reader already holds every
batch as Arrow: a batch where no header name starts with `redrive-` (a main topic's: most
batches) gets constant columns, and each row that carries such headers is decoded by
`headers.read_delivery`, the function every other runtime uses, so all of them agree on what is
malformed and why.

A header name that is not UTF-8 cannot be shown as Spark's string: every reader shows it with
U+FFFD for each invalid sequence (the C readers' Arrow builder, the Python reader through them),
so the row is the same whichever read it, and its `malformed` says so: the headers shown are not
the ones the producer wrote, and a copy made from them would not be either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from redrive import headers as h
from redrive.errors import MalformedHeader

REDRIVE_COLUMN = "redrive"
# Times are timestamps, as Spark users compare them.
REDRIVE_TYPE = StructType([
    StructField("attempt", IntegerType()),
    StructField("first_failure", TimestampType()),
    StructField("original_topic", StringType()),
    StructField("original_partition", IntegerType()),
    StructField("original_offset", LongType()),
    StructField("original_timestamp", TimestampType()),
    StructField("due", TimestampType()),
    StructField("group", StringType()),
    StructField("target", StringType()),
    StructField("malformed", StringType()),
])
FIELDS = tuple(REDRIVE_TYPE.names)
# What the readers put for each invalid UTF-8 sequence of a header name. A name that holds it as
# written is taken as unreadable too: Spark's string column cannot tell the two apart.
REPLACEMENT = "\ufffd"


def unreadable_name(pairs: Sequence[tuple[str, bytes | None]]) -> MalformedHeader | None:
    """Why the record's headers, as the source shows them, are not the ones it carries; None
    when every header name was UTF-8."""
    for name, value in pairs:
        if REPLACEMENT in name:
            return MalformedHeader(name, value, "the header name is not UTF-8 (each invalid "
                                   "sequence is shown as U+FFFD)")
    return None


def arrow_type() -> pa.StructType:
    """The column's Arrow type, as Spark converts it (timestamps in µs, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    kind: pa.StructType = to_arrow_type(REDRIVE_TYPE, timezone="UTC")
    return kind


def with_redrive_column(batch: pa.RecordBatch, kind: pa.StructType) -> pa.RecordBatch:
    """`batch` (with the `headers` column) plus the `redrive` column of Arrow type `kind`
    (`arrow_type()`, made once by the caller)."""
    headers = batch.column("headers")
    pairs = pc.list_flatten(headers)
    names = pairs.field("key")
    carrying = pc.starts_with(names, h.PREFIX)
    # Only a name that is not ASCII can hold U+FFFD: the common batch skips the search.
    if not pc.all(pc.string_is_ascii(names)).as_py():
        carrying = pc.or_(carrying, pc.match_substring(names, REPLACEMENT))
    rows = batch.num_rows
    if not pc.any(carrying).as_py():
        column = _plain(rows, kind)
    else:
        tagged = pc.unique(pc.filter(pc.list_parent_indices(headers), carrying)).to_pylist()
        column = _decoded(rows, kind, tagged, headers.take(tagged).to_pylist())
    return pa.RecordBatch.from_arrays([*batch.columns, column],
                                      names=[*batch.schema.names, REDRIVE_COLUMN])


def _plain(rows: int, kind: pa.StructType) -> pa.StructArray:
    """Every row without redrive headers: attempt 0, nothing else known."""
    arrays = [pa.repeat(pa.scalar(0, kind.field("attempt").type), rows)]
    arrays += [pa.nulls(rows, kind.field(name).type) for name in FIELDS[1:]]
    return pa.StructArray.from_arrays(arrays, fields=list(kind))


def _decoded(rows: int, kind: pa.StructType, tagged: list[int],
             found: list[list[dict[str, Any]]]) -> pa.StructArray:
    values: dict[str, list[Any]] = {name: [None] * rows for name in FIELDS}
    values["attempt"] = [0] * rows
    for row, pairs in zip(tagged, found, strict=True):
        for name, value in _fields([(pair["key"], pair["value"]) for pair in pairs]).items():
            values[name][row] = value
    arrays = [pa.array(values[name], kind.field(name).type) for name in FIELDS]
    return pa.StructArray.from_arrays(arrays, fields=list(kind))


def _fields(pairs: list[tuple[str, bytes | None]]) -> dict[str, Any]:
    """One record's fields of the column; times in µs, as Arrow's timestamps here."""
    try:
        unreadable = unreadable_name(pairs)
        if unreadable is not None:
            raise unreadable
        delivery = h.read_delivery(pairs)
    except MalformedHeader as exc:
        # The group still says whose the copy is: the others skip it (see RetryStream.mine).
        return {"malformed": str(exc), "group": h.readable_group(pairs)}
    origin = delivery.original
    return {
        "attempt": delivery.attempt,
        "first_failure": _micros(delivery.first_failure_ms),
        "original_topic": origin.topic if origin else None,
        "original_partition": origin.partition if origin else None,
        "original_offset": origin.offset if origin else None,
        "original_timestamp": _micros(origin.timestamp_ms) if origin else None,
        "due": _micros(delivery.due_ms),
        "group": delivery.group,
        "target": delivery.target,
    }


def _micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000
