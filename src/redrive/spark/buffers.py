"""Arrow batches from redrive's C readers of a partition range (_fetchread and _rangeread).

A reader hands back each batch as the raw buffers of its Arrow columns; they are wrapped here
without a copy and without a Python object per record. Only the two constant columns (topic and
partition) are made here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from redrive.spark._rangeread import BatchBuffers, BinaryBuffers


class BufferReader(Protocol):
    def read(self, max_rows: int, max_bytes: int) -> BatchBuffers | None: ...


def batches(reader: BufferReader, topic: str, partition: int, schema: pa.Schema, *,
            max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """The range's records as batches of `schema` (Spark's Arrow form of the Kafka schema)."""
    while (buffers := reader.read(max_rows, max_bytes)) is not None:
        rows, keys, values, offsets, stamps, kinds, headers = buffers
        arrays = [
            _binary(pa.binary(), rows, keys),
            _binary(pa.binary(), rows, values),
            pa.repeat(pa.scalar(topic, pa.string()), rows),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(schema.field("timestamp").type, rows,
                                  [None, pa.py_buffer(stamps)]),
            pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(kinds)]),
        ]
        if headers is not None:
            validity, nulls, list_offsets, count, names, header_values = headers
            list_type = schema.field("headers").type
            entry = list_type.value_type
            pairs = pa.StructArray.from_arrays(
                [_binary(entry.field(0).type, count, names),
                 _binary(entry.field(1).type, count, header_values)],
                fields=[entry.field(0), entry.field(1)])
            arrays.append(pa.Array.from_buffers(
                list_type, rows, [_buffer(validity), pa.py_buffer(list_offsets)],
                null_count=nulls, children=[pairs]))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _binary(arrow_type: pa.DataType, rows: int, buffers: BinaryBuffers) -> pa.Array:
    validity, offsets, data, nulls = buffers
    return pa.Array.from_buffers(arrow_type, rows,
                                 [_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _buffer(raw: bytes | None) -> pa.Buffer | None:
    return None if raw is None else pa.py_buffer(raw)
