"""redrive.spark._fetchread fed whole answers (`feed`): record batches encoded by aiokafka, an
encoder written apart from redrive's reading of the protocol, and the inputs the fuzz harness
(tests/fuzz) found the reader mishandling, each kept as a regression."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from redrive.spark import buffers
from redrive.spark._fetchread import FetchReader
from redrive.spark.options import kafka_schema

from .wire import Answer, batch, fetch_answer, framed, record, varint

TOPIC = "fed"
SCHEMA = to_arrow_schema(kafka_schema(True), timezone="UTC")

Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]


def read(*answers: Answer, start: int = 0, end: int = 1_000, committed: bool = True
         ) -> tuple[pa.Table, FetchReader]:
    reader = FetchReader("fed:0", TOPIC, 0, start, end, True, committed, 50)
    reader.feed(b"".join(framed(n, fetch_answer(TOPIC, 0, answer))
                         for n, answer in enumerate(answers, start=1)))
    found = list(buffers.batches(reader, TOPIC, 0, SCHEMA, max_rows=1_000, max_bytes=1 << 20))
    table = pa.Table.from_batches(found, schema=SCHEMA)
    table.validate(full=True)
    return table, reader


def aiokafka_batch(base: int, rows: list[Row], *, producer_id: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(producer_id >= 0),
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=-1, batch_size=1 << 24)
    for delta, key, value, headers in rows:
        builder.append(delta, timestamp=1_700_000_000_000 + delta, key=key, value=value,
                       headers=headers)
    built = bytearray(builder.build())
    struct.pack_into(">q", built, 0, base)
    return bytes(built)


binary = st.one_of(st.none(), st.binary(max_size=300))
rows = st.lists(st.tuples(binary, binary, st.lists(st.tuples(st.text(max_size=20),
                                                             st.binary(max_size=50)),
                                                   max_size=4)),
                min_size=1, max_size=30)


@given(rows)
def test_what_aiokafka_encodes_is_read_back_exactly(given_rows: list[tuple[
        bytes | None, bytes | None, list[tuple[str, bytes]]]]) -> None:
    encoded = [(delta, key, value, headers)
               for delta, (key, value, headers) in enumerate(given_rows)]
    table, reader = read(Answer(aiokafka_batch(10, encoded)), start=10,
                         end=10 + len(encoded))
    assert table.column("offset").to_pylist() == list(range(10, 10 + len(encoded)))
    assert table.column("key").to_pylist() == [key for _, key, _, _ in encoded]
    assert table.column("value").to_pylist() == [value for _, _, value, _ in encoded]
    assert table.column("headers").to_pylist() == [
        [{"key": name, "value": value} for name, value in headers] or None
        for _, _, _, headers in encoded]
    stamps = [int(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()]
    assert stamps == [1_700_000_000_000 + delta for delta, _, _, _ in encoded]
    assert reader.position == 10 + len(encoded) and reader.handoff is None


def test_an_aborted_aiokafka_transaction_is_left_out_under_read_committed() -> None:
    kept = aiokafka_batch(0, [(0, b"k", b"kept", [])], producer_id=7)
    aborted = aiokafka_batch(1, [(0, b"k", b"gone", []), (1, b"k", b"gone", [])], producer_id=8)
    marker = batch(3, [record(0, b"\0\0\0\0\0\0", struct.pack(">hh", 0, 0))],
                   attributes=0x30, producer_id=8)
    answer = Answer(kept + aborted + marker, aborted=[(8, 1)], high_watermark=4)
    committed, _ = read(answer, end=4)
    everything, _ = read(answer, end=4, committed=False)
    assert committed.column("value").to_pylist() == [b"kept"]
    assert everything.column("value").to_pylist() == [b"kept", b"gone", b"gone"]


@pytest.mark.parametrize("name", [b"\xff", b"ok\xc3", b"\xe0\x80\x80x", b"\xed\xa0\x80",
                                  b"\xf4\x90\x80\x80", b"caf\xc3\xa9", b"\xf0\x9f\x98"])
def test_a_header_name_that_is_not_utf8_is_read_as_java_and_python_decode_it(name: bytes) -> None:
    """Found by the fuzz harness: such names made string columns Arrow refused."""
    answer = Answer(batch(0, [record(0, b"v", headers=[(name, b"h")])]), high_watermark=1)
    table, _ = read(answer, end=1)
    assert table.column("headers").to_pylist() == [
        [{"key": name.decode("utf-8", "replace"), "value": b"h"}]]


def test_a_record_cut_in_its_headers_leaves_no_half_row() -> None:
    """Found by the fuzz harness: the key and value were written before the headers were found
    malformed, and the batch's null counts no longer matched its rows."""
    whole = record(0, None, None, headers=[("h", b"v")])
    # Offset delta 1, null key and value, one header whose value claims 25 bytes of 1.
    body = b"\0\0\x02\x01\x01\x02\x02h" + varint(25) + b"v"
    table, reader = read(Answer(batch(0, [whole, varint(len(body)) + body]),
                                high_watermark=2), end=2)
    assert table.num_rows == 1 and table.column("key").null_count == 1
    assert reader.position == 1 and reader.handoff == "a malformed record header"


def test_an_aborted_transaction_count_past_the_answer_is_not_allocated_for() -> None:
    """Found by the fuzz harness (AddressSanitizer): a count of 2^31 - 1 asked for 32 GB."""
    body = bytearray(fetch_answer(TOPIC, 0, Answer(b"", aborted=[(1, 0)])))
    at = body.index(struct.pack(">qq", 1, 0)) - 4
    struct.pack_into(">i", body, at, 0x7FFFFFFF)
    reader = FetchReader("fed:0", TOPIC, 0, 0, 10, True, True, 50)
    reader.feed(framed(1, bytes(body)))
    assert reader.read(100, 1 << 20) is None
    assert reader.handoff == "an answer shorter than its aborted transactions"


@pytest.mark.parametrize(("base", "last_delta", "why"), [
    (2**63 - 1, 1, "a record batch with offsets out of range"),
    (-5, 0, "a record batch with offsets out of range"),
])
def test_batch_offsets_out_of_range_hand_off(base: int, last_delta: int, why: str) -> None:
    """Found by the fuzz harness (UndefinedBehaviorSanitizer: signed overflow)."""
    answer = Answer(batch(base, [record(0, b"v")], last_delta=last_delta))
    table, reader = read(answer, end=10)
    assert table.num_rows == 0 and reader.handoff == why


def test_a_time_past_what_microseconds_hold_stays_at_the_edge() -> None:
    """Found by the fuzz harness (UndefinedBehaviorSanitizer: signed overflow)."""
    table, _ = read(Answer(batch(0, [record(0, b"v")], base_ts=2**62)), end=1)
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [2**63 - 1]
