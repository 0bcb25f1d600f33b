"""redrive.kafka.ranges against the session broker: [start, end) read exactly, retention gaps,
transaction markers and aborted records, reads that cannot progress, read_topic and heads."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence

import pytest

from redrive import kafka
from redrive.kafka.ranges import (
    Chunk,
    LastClientError,
    PartitionRange,
    RangeReader,
    RangeReadFailed,
    RecordsLost,
    first_kept,
    heads,
    range_consumer,
    read_topic,
)

from .conftest import (
    delete_records_below,
    offsets_of,
    produce_transactions,
    produce_values,
    read_partition,
    values_of,
)

NewTopic = Callable[..., str]

# A read that ends by itself ends within a few polls (0.5 s each); a hang is caught well before
# the idle limit, and the idle limit is generous for a loaded machine.
IDLE_S = 30.0
PROMPT_S = 10.0
# For clients of a closed port: their "connection refused" lines stay out of the terminal.
QUIET = logging.getLogger("test.closed-port")


def closed_address() -> str:
    """An address on which nothing listens."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{closed.getsockname()[1]}"


def read_ranges(bootstrap: str, ranges: Sequence[PartitionRange], *, skip_lost: bool = False,
                batch: int = 5_000, isolation: str = "read_committed",
                idle_s: float = IDLE_S) -> list[Chunk]:
    errors = LastClientError()
    consumer = range_consumer(bootstrap, {"isolation.level": isolation}, errors)
    try:
        reader = RangeReader(consumer, ranges, idle_s=idle_s, skip_lost=skip_lost, batch=batch,
                             errors=errors)
        chunks = list(reader.chunks())
        for part in ranges:
            assert reader.position(part.key) == max(part.start, part.end)
        return chunks
    finally:
        consumer.close()


def by_partition(chunks: Sequence[Chunk]) -> dict[int, list[tuple[int, str]]]:
    """(offset, value) of every record read, per partition; each chunk's offsets checked against
    its messages."""
    found: dict[int, list[tuple[int, str]]] = {}
    for chunk in chunks:
        assert chunk.offsets == offsets_of(chunk.messages)
        assert {(m.topic(), m.partition()) for m in chunk.messages} == {chunk.range.key}
        found.setdefault(chunk.range.partition, []).extend(
            zip(chunk.offsets, values_of(chunk.messages), strict=True))
    return found


# --- [start, end) exactly --------------------------------------------------------------------


def test_a_range_is_read_from_start_to_end_exactly_in_small_batches(
        bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(1)
    produce_values(bootstrap, topic, [f"v{i}" for i in range(20)], headers=[("h", b"\x00\xff")])
    part = PartitionRange(topic, 0, 5, 15)

    chunks = read_ranges(bootstrap, [part], batch=3)

    assert by_partition(chunks) == {0: [(i, f"v{i}") for i in range(5, 15)]}
    assert all(chunk.range == part and 1 <= len(chunk.messages) <= 3 for chunk in chunks)
    first = chunks[0].messages[0]
    assert (first.key(), first.headers()) == (b"k-v5", [("h", b"\x00\xff"), ("value", b"v5")])


def test_ranges_of_several_partitions_each_stop_at_their_own_end(
        bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(3)
    for partition in range(3):
        produce_values(bootstrap, topic, [f"p{partition}-{i}" for i in range(10)],
                       partition=partition)
    ranges = [PartitionRange(topic, 0, 2, 7), PartitionRange(topic, 1, 4, 4),
              PartitionRange(topic, 2, 6, 10)]  # p1 empty; p2 ends at the high watermark

    chunks = read_ranges(bootstrap, ranges)

    assert by_partition(chunks) == {0: [(i, f"p0-{i}") for i in range(2, 7)],
                                    2: [(i, f"p2-{i}") for i in range(6, 10)]}


def test_a_range_past_the_end_of_data_fails_naming_partition_and_offset_after_its_records(
        bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(2)
    produce_values(bootstrap, topic, ["a", "b"], partition=1)
    errors = LastClientError()
    consumer = range_consumer(bootstrap, errors=errors)
    reader = RangeReader(consumer, [PartitionRange(topic, 1, 0, 5)], idle_s=1.5, errors=errors)
    read: list[int] = []
    started = time.monotonic()
    try:
        with pytest.raises(RangeReadFailed) as failed:
            for chunk in reader.chunks():
                read.extend(chunk.offsets)
    finally:
        consumer.close()
    assert read == [0, 1]
    assert time.monotonic() - started < PROMPT_S
    assert not isinstance(failed.value, RecordsLost)
    assert (failed.value.topic, failed.value.partition) == (topic, 1)
    assert str(failed.value) == (f"reading {topic}[1] offsets [0, 5) failed: "
                                 "stuck at offset 2 for 1.5s")


def test_an_unreachable_broker_fails_the_read_naming_partition_and_the_clients_error() -> None:
    address = closed_address()
    errors = LastClientError()
    consumer = range_consumer({"bootstrap.servers": address, "logger": QUIET}, errors=errors)
    reader = RangeReader(consumer, [PartitionRange("orders-far", 3, 7, 12)], idle_s=2.0,
                         errors=errors)
    try:
        with pytest.raises(RangeReadFailed) as failed:
            list(reader.chunks())
    finally:
        consumer.close()
    assert (failed.value.topic, failed.value.partition) == ("orders-far", 3)
    message = str(failed.value)
    assert message.startswith("reading orders-far[3] offsets [7, 12) failed: "
                              "stuck at offset 7 for 2.0s; the client's last error: ")
    assert address in message


# --- retention gaps --------------------------------------------------------------------------


def test_records_deleted_inside_a_range_raise_records_lost_naming_them(
        bootstrap: str, new_topic: NewTopic) -> None:
    # The range [2, 10) was planned; offsets 0 to 5 were deleted before it was read, so its
    # part [2, 6) is gone and [6, 10) is still there.
    topic = new_topic(1)
    produce_values(bootstrap, topic, [f"v{i}" for i in range(10)])
    delete_records_below(bootstrap, topic, 0, 6)

    with pytest.raises(RecordsLost) as lost:
        read_ranges(bootstrap, [PartitionRange(topic, 0, 2, 10)])

    assert (lost.value.topic, lost.value.partition) == (topic, 0)
    assert str(lost.value) == (f"reading {topic}[0] offsets [2, 10) failed: offsets 2 to 5 are "
                               "gone from the broker (deleted or past retention)")


def test_skip_lost_logs_the_gap_and_reads_the_records_after_it(
        bootstrap: str, new_topic: NewTopic, caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic(2)
    produce_values(bootstrap, topic, [f"a{i}" for i in range(10)], partition=0)
    produce_values(bootstrap, topic, [f"b{i}" for i in range(10)], partition=1)
    delete_records_below(bootstrap, topic, 0, 6)
    ranges = [PartitionRange(topic, 0, 2, 10), PartitionRange(topic, 1, 3, 8)]

    with caplog.at_level(logging.WARNING, logger="redrive.kafka.ranges"):
        chunks = read_ranges(bootstrap, ranges, skip_lost=True)

    assert by_partition(chunks) == {0: [(i, f"a{i}") for i in range(6, 10)],
                                    1: [(i, f"b{i}") for i in range(3, 8)]}
    assert [r.getMessage() for r in caplog.records] == [
        f"{topic}[0]: offsets 2 to 5 are gone from the broker; skipped"]


def test_skip_lost_on_a_range_wholly_deleted_reads_nothing_and_ends(
        bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(1)
    produce_values(bootstrap, topic, [f"v{i}" for i in range(10)])
    delete_records_below(bootstrap, topic, 0, 8)
    started = time.monotonic()

    assert read_ranges(bootstrap, [PartitionRange(topic, 0, 1, 5)], skip_lost=True) == []
    assert time.monotonic() - started < PROMPT_S
    with pytest.raises(RecordsLost, match=r"offsets 1 to 7 are gone"):
        read_ranges(bootstrap, [PartitionRange(topic, 0, 1, 5)])


def test_a_range_skipped_whole_is_left_unassigned_so_close_returns(
        bootstrap: str, new_topic: NewTopic) -> None:
    # Assigned again with nothing left to read, the partition kept a fetcher that nothing polled
    # and close() waited forever about once in twenty runs.
    topic = new_topic(2)
    produce_values(bootstrap, topic, [f"a{i}" for i in range(10)], partition=0)
    produce_values(bootstrap, topic, [f"b{i}" for i in range(4)], partition=1)
    delete_records_below(bootstrap, topic, 0, 8)
    consumer = range_consumer(bootstrap)
    try:
        reader = RangeReader(consumer, [PartitionRange(topic, 0, 1, 5),
                                        PartitionRange(topic, 1, 0, 4)],
                             idle_s=IDLE_S, skip_lost=True)
        chunks = list(reader.chunks())
        assert by_partition(chunks) == {1: [(i, f"b{i}") for i in range(4)]}
        assert reader.position((topic, 0)) == 5
        assert [(tp.topic, tp.partition) for tp in consumer.assignment()] == [(topic, 1)]
    finally:
        started = time.monotonic()
        consumer.close()
        assert time.monotonic() - started < PROMPT_S


def test_first_kept_goes_on_where_the_broker_still_holds_the_offset() -> None:
    part = PartitionRange("orders", 4, 10, 20)
    assert first_kept(part, 12, 12, skip_lost=False) == 12
    assert first_kept(part, 15, 12, skip_lost=False) == 15
    assert first_kept(part, 12, 16, skip_lost=True) == 16
    assert first_kept(part, 12, 25, skip_lost=True) == 20  # never past the range's end
    with pytest.raises(RecordsLost) as lost:
        first_kept(part, 12, 16, skip_lost=False)
    assert (lost.value.topic, lost.value.partition) == ("orders", 4)
    assert str(lost.value) == ("reading orders[4] offsets [12, 20) failed: offsets 12 to 15 "
                               "are gone from the broker (deleted or past retention)")


# --- transactions ----------------------------------------------------------------------------


def test_a_range_ending_at_the_high_watermark_after_a_committed_transaction_completes(
        bootstrap: str, new_topic: NewTopic, unique_name: Callable[..., str]) -> None:
    # Offsets 0-2 are records and 3 is the commit marker: a reader that waits to see offset
    # end - 1 = 3 would wait for ever.
    topic = new_topic(1)
    produce_transactions(bootstrap, topic, unique_name(), [(["t0", "t1", "t2"], True)])
    consumer = kafka.consumer(bootstrap)
    low, high = kafka.watermarks(consumer, topic, 0)
    consumer.close()
    assert (low, high) == (0, 4)
    started = time.monotonic()

    chunks = read_ranges(bootstrap, [PartitionRange(topic, 0, 0, high)])
    marker_only = read_ranges(bootstrap, [PartitionRange(topic, 0, 3, high)])

    assert by_partition(chunks) == {0: [(0, "t0"), (1, "t1"), (2, "t2")]}
    assert marker_only == []
    assert time.monotonic() - started < PROMPT_S


def test_aborted_records_are_not_read_under_read_committed(
        bootstrap: str, new_topic: NewTopic, unique_name: Callable[..., str]) -> None:
    # c0 c1 | commit marker 2 | a0 a1 a2 | abort marker 6 | c2 | commit marker 8
    topic = new_topic(1)
    produce_transactions(bootstrap, topic, unique_name(), [
        (["c0", "c1"], True), (["a0", "a1", "a2"], False), (["c2"], True)])
    whole = PartitionRange(topic, 0, 0, 9)
    started = time.monotonic()

    committed = read_ranges(bootstrap, [whole])
    only_aborted = read_ranges(bootstrap, [PartitionRange(topic, 0, 3, 7)])
    uncommitted = read_ranges(bootstrap, [whole], isolation="read_uncommitted")

    assert by_partition(committed) == {0: [(0, "c0"), (1, "c1"), (7, "c2")]}
    assert only_aborted == []
    assert time.monotonic() - started < PROMPT_S
    # The aborted records are there for a reader that asks for them.
    assert by_partition(uncommitted) == {0: [(0, "c0"), (1, "c1"), (3, "a0"), (4, "a1"),
                                             (5, "a2"), (7, "c2")]}


# --- read_topic ------------------------------------------------------------------------------


def test_read_topic_reads_each_partition_from_its_first_kept_offset_to_its_end_at_the_call(
        bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(3)
    for partition in range(3):
        produce_values(bootstrap, topic, [f"p{partition}-{i}" for i in range(6)],
                       partition=partition)
    delete_records_below(bootstrap, topic, 2, 4)

    reading = read_topic(bootstrap, topic, 3, idle_s=IDLE_S)
    first = next(reading)
    # Records written once the read started are left for the next read.
    for partition in range(3):
        produce_values(bootstrap, topic, [f"late-{partition}"], partition=partition)
    messages = [first, *reading]

    found = sorted((m.partition(), m.offset(), values_of([m])[0]) for m in messages)
    assert found == ([(0, i, f"p0-{i}") for i in range(6)] + [(1, i, f"p1-{i}") for i in range(6)]
                     + [(2, i, f"p2-{i}") for i in (4, 5)])
    assert len(read_partition(bootstrap, topic, 0)) == 7  # the late records were written


def test_read_topic_reads_only_what_narrow_leaves(bootstrap: str, new_topic: NewTopic) -> None:
    topic = new_topic(3)
    for partition in range(3):
        produce_values(bootstrap, topic, [f"p{partition}-{i}" for i in range(6)],
                       partition=partition)
    asked: list[tuple[int, int, int]] = []

    def narrow(partition: int, low: int, high: int) -> tuple[int, int] | None:
        asked.append((partition, low, high))
        return None if partition == 1 else (low + partition, high - 1)

    found = sorted((m.partition(), m.offset())
                   for m in read_topic(bootstrap, topic, 3, idle_s=IDLE_S, narrow=narrow))

    assert asked == [(0, 0, 6), (1, 0, 6), (2, 0, 6)]
    assert found == [(0, i) for i in range(0, 5)] + [(2, i) for i in range(2, 5)]


# --- heads -----------------------------------------------------------------------------------


def test_heads_gives_the_first_record_of_each_range_that_holds_one(
        bootstrap: str, new_topic: NewTopic, unique_name: Callable[..., str]) -> None:
    topic = new_topic(4)
    produce_values(bootstrap, topic, [f"p0-{i}" for i in range(5)], partition=0,
                   headers=[("trace", b"t-0")])
    # p1: an aborted transaction (0-1, marker 2) before a committed one (3, marker 4).
    produce_transactions(bootstrap, topic, unique_name(), [(["gone-0", "gone-1"], False),
                                                          (["kept-3"], True)], partition=1)
    # p2: only an aborted transaction (0-2, marker 3).
    produce_transactions(bootstrap, topic, unique_name(), [(["x", "y", "z"], False)],
                         partition=2)
    produce_values(bootstrap, topic, ["p3-0"], partition=3)
    ranges = [PartitionRange(topic, 0, 2, 1_000_000),  # far past the end: the head is enough
              PartitionRange(topic, 1, 0, 5),
              PartitionRange(topic, 2, 0, 4),
              PartitionRange(topic, 3, 1, 1)]  # empty
    started = time.monotonic()

    found = heads(bootstrap, ranges, idle_s=IDLE_S)

    assert time.monotonic() - started < PROMPT_S
    assert sorted(found) == [(topic, 0), (topic, 1)]
    head = found[(topic, 0)]
    assert (head.topic, head.partition, head.offset, head.key, head.value) == (
        topic, 0, 2, b"k-p0-2", b"p0-2")
    assert head.headers == [("trace", b"t-0"), ("value", b"p0-2")]
    assert head.timestamp_ms > 0
    assert (found[(topic, 1)].offset, found[(topic, 1)].value) == (3, b"kept-3")


def test_heads_on_an_unreachable_broker_fails_naming_the_partition() -> None:
    address = closed_address()
    with pytest.raises(RangeReadFailed) as failed:
        heads({"bootstrap.servers": address, "logger": QUIET},
              [PartitionRange("orders-far", 2, 0, 3)], idle_s=2.0)
    assert (failed.value.topic, failed.value.partition) == ("orders-far", 2)
    assert "stuck at offset 0 for 2.0s; the client's last error: " in str(failed.value)
    assert address in str(failed.value)
