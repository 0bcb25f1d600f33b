"""redrive.spark._fetchread against a scripted peer: the wire cases a real broker shows only in rare
states. (tests/integration/spark/test_range_readers.py reads real brokers with every reader.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from redrive.spark import buffers
from redrive.spark._fetchread import FetchReader, ReadError
from redrive.spark.source import kafka_schema

from .wire import Answer, Fetch, Peer, batch, record

TOPIC = "orders"
LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
MARKER = 0x20


@pytest.fixture
def peer() -> Iterator[Callable[..., Peer]]:
    started: list[Peer] = []

    def start(answer: Callable[[Fetch], Answer], **kwargs: object) -> Peer:
        started.append(Peer(TOPIC, 0, answer, **kwargs))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for each in started:
        each.close()


def answers(*given: Answer) -> Callable[[Fetch], Answer]:
    """The given answers in turn, then empty ones."""
    queue = list(given)
    return lambda fetch: queue.pop(0) if queue else Answer()


def reader(peer: Peer, start: int, end: int, *, headers: bool = True,
           committed: bool = True, timeout_ms: int = 2_000) -> FetchReader:
    return FetchReader(peer.bootstrap, TOPIC, 0, start, end, headers, committed, timeout_ms)


def table(fetch_reader: FetchReader, max_rows: int = 1_000) -> pa.Table:
    schema = to_arrow_schema(kafka_schema(True), timezone="UTC")
    batches = list(buffers.batches(fetch_reader, TOPIC, 0, schema, max_rows=max_rows,
                                        max_bytes=1 << 30))
    return pa.Table.from_batches(batches, schema=schema)


def with_length(data: bytes, length: int) -> bytes:
    """A record batch with its length field set to `length`."""
    return data[:8] + struct.pack(">i", length) + data[12:]


def values(read: pa.Table) -> list[bytes | None]:
    return read.column("value").to_pylist()


def test_records_keys_headers_and_times_come_through(peer: Callable[..., Peer]) -> None:
    records = [
        record(0, b"v0", b"k0", headers=[("a", b"1"), ("nothing", None)]),
        record(1, None, None, ts_delta=5),
        record(2, b"", b""),
    ]
    source = peer(answers(Answer(batch(40, records, base_ts=1_700_000_000_000),
                                 high_watermark=43)))
    read = table(reader(source, 40, 43))
    assert read.to_pylist() == [
        {"key": b"k0", "value": b"v0", "topic": TOPIC, "partition": 0, "offset": 40,
         "timestamp": read.column("timestamp")[0].as_py(), "timestampType": 0,
         "headers": [{"key": "a", "value": b"1"}, {"key": "nothing", "value": None}]},
        {"key": None, "value": None, "topic": TOPIC, "partition": 0, "offset": 41,
         "timestamp": read.column("timestamp")[1].as_py(), "timestampType": 0, "headers": None},
        {"key": b"", "value": b"", "topic": TOPIC, "partition": 0, "offset": 42,
         "timestamp": read.column("timestamp")[2].as_py(), "timestampType": 0, "headers": None},
    ]
    assert [t.value for t in read.column("timestamp")] == \
        [1_700_000_000_000_000, 1_700_000_000_005_000, 1_700_000_000_000_000]
    assert source.fetches[0].offset == 40


def test_log_append_time_is_the_batch_s_max_timestamp(peer: Callable[..., Peer]) -> None:
    source = peer(answers(Answer(batch(0, [record(0, b"a", ts_delta=1), record(1, b"b")],
                                       base_ts=1_000, max_ts=9_000, attributes=LOG_APPEND))))
    read = table(reader(source, 0, 2))
    assert [t.value for t in read.column("timestamp")] == [9_000_000, 9_000_000]
    assert read.column("timestampType").to_pylist() == [1, 1]


def test_a_batch_beginning_before_the_range_and_a_range_ending_inside_a_batch(
        peer: Callable[..., Peer]) -> None:
    source = peer(answers(Answer(batch(0, [record(i, b"v%d" % i) for i in range(10)]))))
    fetch_reader = reader(source, 4, 7)
    assert values(table(fetch_reader)) == [b"v4", b"v5", b"v6"]
    assert fetch_reader.position == 7
    assert fetch_reader.handoff is None


def test_a_batch_is_taken_across_reads_when_a_read_fills_up(peer: Callable[..., Peer]) -> None:
    source = peer(answers(Answer(batch(0, [record(i, b"v%d" % i) for i in range(10)]))))
    fetch_reader = reader(source, 0, 10)
    read = table(fetch_reader, max_rows=3)
    assert [b.num_rows for b in read.to_batches()] == [3, 3, 3, 1]
    assert values(read) == [b"v%d" % i for i in range(10)]
    assert len(source.fetches) == 1


def test_a_batch_cut_short_by_the_answer_is_fetched_again(peer: Callable[..., Peer]) -> None:
    first = batch(0, [record(0, b"a"), record(1, b"b")])
    second = batch(2, [record(0, b"c"), record(1, b"d")])
    source = peer(answers(Answer(first + second[:30]), Answer(second)))
    assert values(table(reader(source, 0, 4))) == [b"a", b"b", b"c", b"d"]
    assert [f.offset for f in source.fetches] == [0, 2]


def test_a_batch_larger_than_the_fetch_size_makes_the_next_fetch_larger(
        peer: Callable[..., Peer]) -> None:
    big = batch(0, [record(0, b"x" * (3 << 20))])
    source = peer(lambda fetch: Answer(big if fetch.partition_max_bytes >= len(big)
                                       else big[:fetch.partition_max_bytes]))
    assert values(table(reader(source, 0, 1))) == [b"x" * (3 << 20)]
    assert source.fetches[0].partition_max_bytes < len(big) <= \
        source.fetches[-1].partition_max_bytes


def test_aborted_transactions_and_markers(peer: Callable[..., Peer]) -> None:
    # Producer 5 aborts offsets 1-2 (marker at 3); producer 6 commits offset 4 (marker at 5);
    # producer 5 then commits offset 6 (marker at 7): its later transaction is read.
    abort, commit = b"\0\0\0\0", b"\0\0\0\1"
    data = (batch(0, [record(0, b"plain")])
            + batch(1, [record(0, b"aborted1"), record(1, b"aborted2")],
                    attributes=TRANSACTIONAL, producer_id=5)
            + batch(3, [record(0, b"", abort)], attributes=TRANSACTIONAL | MARKER, producer_id=5)
            + batch(4, [record(0, b"committed")], attributes=TRANSACTIONAL, producer_id=6)
            + batch(5, [record(0, b"", commit)], attributes=TRANSACTIONAL | MARKER, producer_id=6)
            + batch(6, [record(0, b"later")], attributes=TRANSACTIONAL, producer_id=5)
            + batch(7, [record(0, b"", commit)], attributes=TRANSACTIONAL | MARKER,
                    producer_id=5))
    committed = peer(answers(Answer(data, aborted=[(5, 1)])))
    fetch_reader = reader(committed, 0, 8)
    assert values(table(fetch_reader)) == [b"plain", b"committed", b"later"]
    assert fetch_reader.position == 8
    uncommitted = peer(answers(Answer(data)))
    assert values(table(reader(uncommitted, 0, 8, committed=False))) == \
        [b"plain", b"aborted1", b"aborted2", b"committed", b"later"]


def test_an_abort_marker_closes_its_producer_however_often_the_answer_names_it(
        peer: Callable[..., Peer]) -> None:
    # As in Kafka's consumer, the aborted producers are a set: the marker ends producer 5's
    # aborted transaction even when the answer lists it twice, and its next one is read.
    data = (batch(0, [record(0, b"aborted0"), record(1, b"aborted1")],
                  attributes=TRANSACTIONAL, producer_id=5)
            + batch(2, [record(0, b"", b"\0\0\0\0")], attributes=TRANSACTIONAL | MARKER,
                    producer_id=5)
            + batch(3, [record(0, b"committed")], attributes=TRANSACTIONAL, producer_id=5))
    fetch_reader = reader(peer(answers(Answer(data, aborted=[(5, 0), (5, 1)]))), 0, 4)
    assert values(table(fetch_reader)) == [b"committed"]
    assert fetch_reader.position == 4


@pytest.mark.parametrize(("given", "why"), [
    (Answer(batch(0, [record(0, b"a")]) + batch(1, [record(0, b"b")], magic=1)),
     "a record batch of message format v1"),
    (Answer(batch(0, [record(0, b"a")]) + batch(1, [record(0, b"b")], attributes=4)),
     "a compressed record batch (codec 4)"),
    (Answer(batch(0, [record(0, b"a")]) + batch(1, [b"\x7f\x00"])), "a malformed record"),
    # A batch length below the batch header's own size: garbled, not cut by the answer's limit.
    (Answer(batch(0, [record(0, b"a")]) + with_length(batch(1, [record(0, b"b")]), -5)),
     "a malformed record batch"),
    (Answer(batch(0, [record(0, b"a")]) + with_length(batch(1, [record(0, b"b")]), 40)),
     "a malformed record batch"),
])
def test_what_the_reader_does_not_handle_is_handed_off_at_its_offset(
        peer: Callable[..., Peer], given: Answer, why: str) -> None:
    fetch_reader = reader(peer(answers(given)), 0, 5)
    assert values(table(fetch_reader)) == [b"a"]
    assert fetch_reader.position == 1
    assert fetch_reader.handoff == why


def test_a_partition_error_is_handed_off_naming_its_code(peer: Callable[..., Peer]) -> None:
    fetch_reader = reader(peer(answers(Answer(None, error=6))), 3, 5)
    assert table(fetch_reader).num_rows == 0
    assert (fetch_reader.position, fetch_reader.handoff) == \
        (3, "the broker answered the fetch with error 6")


def test_a_connection_dropped_mid_answer_is_handed_off_after_the_last_whole_batch(
        peer: Callable[..., Peer]) -> None:
    data = batch(0, [record(0, b"a"), record(1, b"b")]) + batch(2, [record(0, b"c")])
    source = peer(answers(Answer(data, cut=40 + len(TOPIC) + 4 + len(data) - 5)))
    fetch_reader = reader(source, 0, 3)
    assert values(table(fetch_reader)) == [b"a", b"b"]
    assert fetch_reader.position == 2
    assert fetch_reader.handoff is not None
    assert "the broker closed the connection" in fetch_reader.handoff


def test_the_leader_named_by_metadata_is_read(peer: Callable[..., Peer]) -> None:
    leader = peer(answers(Answer(batch(0, [record(0, b"from the leader")]))))
    bootstrap = peer(answers(), leader=leader.address)
    assert values(table(reader(bootstrap, 0, 1))) == [b"from the leader"]
    assert (bootstrap.metadata_requests, len(bootstrap.fetches), len(leader.fetches)) == (1, 0, 1)


def test_a_range_past_what_the_partition_holds_fails_naming_the_offset(
        peer: Callable[..., Peer]) -> None:
    fetch_reader = reader(peer(answers(Answer(batch(0, [record(0, b"a")])))), 0, 2,
                          timeout_ms=300)
    with pytest.raises(ReadError, match=r"stuck at offset 1 for 0\.3s"):
        table(fetch_reader)


def test_a_reader_never_initialised_leaves_descriptor_0_alone(tmp_path: Path) -> None:
    # A reader whose __init__ failed, or never ran, has no connection: closing it must not close
    # descriptor 0, which by then may be any file or socket the process opened.
    saved = os.dup(0)
    try:
        victim = os.open(tmp_path / "victim", os.O_CREAT | os.O_RDWR)
        os.dup2(victim, 0)
        os.close(victim)
        with pytest.raises(ValueError, match="bad range"):
            FetchReader("localhost:1", TOPIC, 0, -1, 10, False, False, 1_000)
        with pytest.raises(TypeError):
            FetchReader("localhost:1", TOPIC, 0, 0, 10, False, False)  # type: ignore[call-arg]
        FetchReader.__new__(FetchReader).close()
        assert os.fstat(0).st_ino == os.stat(tmp_path / "victim").st_ino
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_header_bytes_count_toward_a_read_s_max_bytes(peer: Callable[..., Peer]) -> None:
    records = [record(i, b"v", headers=[("h", b"x" * 1_000)]) for i in range(10)]
    fetch_reader = reader(peer(answers(Answer(batch(0, records)))), 0, 10)
    schema = to_arrow_schema(kafka_schema(True), timezone="UTC")
    read = list(buffers.batches(fetch_reader, TOPIC, 0, schema, max_rows=1_000,
                                max_bytes=3_000))
    assert [b.num_rows for b in read] == [3, 3, 3, 1]


def with_column_limit(into: Path, limit: int, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The reader built with columns limited to `limit` bytes, so that a test reaches the limit
    (2 GiB in the real build) without gigabytes. Loading it puts it in sys.modules in place of
    the real one (as any single-phase extension): the real one is put back after the test."""
    name = "redrive.spark._fetchread"
    monkeypatch.setitem(sys.modules, name, sys.modules[name])
    source = Path(__file__).resolve().parents[3] / "src" / "redrive" / "spark"
    if shutil.which("gcc") is None or not (source / "_fetchread.c").exists():
        pytest.skip("needs gcc and the reader's C sources")
    target = into / "_fetchread_limited.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", f"-DCOLUMN_LIMIT={limit}",
                    f"-I{sysconfig.get_paths()['include']}", str(source / "_fetchread.c"),
                    str(source / "_fetchconn.c"), "-o", str(target)], check=True)
    loader = importlib.machinery.ExtensionFileLoader(name, str(target))
    spec = importlib.util.spec_from_file_location(name, target, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_record_over_the_column_limit_is_handed_off_whole(
        peer: Callable[..., Peer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The 34th record's header value takes its column past the limit after its key, value and
    # header name are written: the batch must end with the 33 whole rows before it.
    limited = with_column_limit(tmp_path, 100_000, monkeypatch)
    assert limited.FetchReader is not FetchReader
    records = [record(i, b"v%d" % i, b"k", headers=[("h", b"x" * 3_000)]) for i in range(50)]
    source = peer(answers(Answer(batch(0, records))))
    fetch_reader = limited.FetchReader(source.bootstrap, TOPIC, 0, 0, 50, True, True, 2_000)
    read = table(fetch_reader)
    read.validate(full=True)
    assert values(read) == [b"v%d" % i for i in range(33)]
    assert read.column("headers").to_pylist() == [[{"key": "h", "value": b"x" * 3_000}]] * 33
    assert (fetch_reader.position, fetch_reader.handoff) == \
        (33, "out of memory, or a batch over 2 GiB")


def test_a_reader_refuses_other_threads_while_it_reads(peer: Callable[..., Peer]) -> None:
    # read() waits on the socket without the GIL: close() or feed() from another thread would
    # free the buffer it receives into.
    asked, answer = threading.Event(), threading.Event()

    def slow(fetch: Fetch) -> Answer:
        asked.set()
        answer.wait(10)
        return Answer(batch(0, [record(0, b"a")]))

    fetch_reader = reader(peer(slow), 0, 1)
    read: list[object] = []
    thread = threading.Thread(target=lambda: read.append(fetch_reader.read(10, 1 << 20)))
    thread.start()
    try:
        assert asked.wait(10)
        for call in (fetch_reader.close, lambda: fetch_reader.feed(b""),
                     lambda: fetch_reader.read(10, 1 << 20)):
            with pytest.raises(RuntimeError, match="reading in another thread"):
                call()
    finally:
        answer.set()
        thread.join(10)
    assert read and read[0] is not None
    assert fetch_reader.position == 1
    fetch_reader.close()



@pytest.mark.parametrize(("size", "why"), [
    (0x7FFF_FFF0, "a metadata answer of 2147483632 bytes"),
    (0xFFFF_FFF0, "an answer too short for its header"),
])
def test_a_garbled_metadata_answer_size_is_handed_off_at_once(size: int, why: str) -> None:
    # Taken whole, a metadata answer's size is allocated and waited for: a garbled one (2 GiB, or
    # a negative one read as 4 GiB) must not hold the reader for its answer timeout.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def answer() -> None:
            connection, _ = listener.accept()
            with connection:
                head = connection.recv(4, socket.MSG_WAITALL)
                request = connection.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                correlation = request[4:8]
                connection.sendall(struct.pack(">I", size) + correlation)
                connection.recv(1)  # open until the reader lets go

        peer_thread = threading.Thread(target=answer, daemon=True)
        peer_thread.start()
        host, port = listener.getsockname()
        fetch_reader = FetchReader(f"{host}:{port}", TOPIC, 0, 0, 1, False, True, 1_000)
        assert fetch_reader.read(10, 1 << 20) is None
        fetch_reader.close()
        peer_thread.join(10)
    assert fetch_reader.handoff == why
