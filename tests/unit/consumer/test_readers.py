"""The member and the retry reader: which consumer each call reaches, holds on the reader as
unassign and assign at the held offset, and resting once every partition reported its end
(recording stand-ins here; tests/integration/consumer/test_retry_reader.py runs it on a broker)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, TopicPartition

from redrive.consumer import readers as readers_module
from redrive.consumer.readers import Readers

MAIN, RETRY = "orders", "orders.g.retry.5s"


class Client:
    """Records the calls a Readers makes, as (call, [(topic, partition, offset)])."""

    def __init__(self) -> None:
        self.made: list[tuple[str, list[tuple[str, int, int]]]] = []
        self.queue: list[Any] = []
        self.positions: dict[tuple[str, int], int] = {}

    def _note(self, call: str, partitions: list[TopicPartition]) -> None:
        self.made.append((call, [(p.topic, p.partition, p.offset) for p in partitions]))

    def __getattr__(self, call: str) -> Any:
        if call in ("pause", "resume", "assign", "incremental_assign", "incremental_unassign"):
            return lambda partitions: self._note(call, partitions)
        if call == "seek":
            return lambda partition: self._note("seek", [partition])
        raise AttributeError(call)

    def consume(self, count: int, wait_s: float) -> list[Any]:
        found, self.queue = self.queue, []
        return found

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition,
                               self.positions.get((p.topic, p.partition), OFFSET_INVALID))
                for p in partitions]


class Message:
    def __init__(self, topic: str, partition: int, eof: bool = False, offset: int = -1) -> None:
        self._tp = (topic, partition)
        self._eof = eof
        self._offset = offset

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None


def started() -> tuple[Readers, Client, Client]:
    member, reader = Client(), Client()
    readers = Readers(member, reader, [RETRY], incremental=False)  # type: ignore[arg-type]
    readers.assigned([TopicPartition(MAIN, 0), TopicPartition(RETRY, 0), TopicPartition(RETRY, 1)])
    return readers, member, reader


def test_the_member_owns_every_partition_and_the_reader_fetches_the_retry_ones() -> None:
    readers, member, reader = started()
    assert member.made == [
        ("assign", [(MAIN, 0, OFFSET_INVALID), (RETRY, 0, OFFSET_INVALID),
                    (RETRY, 1, OFFSET_INVALID)]),
        ("pause", [(RETRY, 0, OFFSET_INVALID), (RETRY, 1, OFFSET_INVALID)])]
    assert reader.made == [("incremental_assign", [(RETRY, 0, OFFSET_INVALID),
                                                   (RETRY, 1, OFFSET_INVALID)])]
    assert readers.reading_retries


def test_a_held_retry_partition_is_unassigned_and_assigned_again_at_the_held_offset() -> None:
    readers, member, reader = started()
    member.made.clear()
    reader.made.clear()
    readers.pause([TopicPartition(MAIN, 0, 7), TopicPartition(RETRY, 1, 40)])
    readers.seek(TopicPartition(MAIN, 0, 7))
    readers.seek(TopicPartition(RETRY, 1, 40))
    assert member.made == [("pause", [(MAIN, 0, 7)]), ("seek", [(MAIN, 0, 7)])]
    assert reader.made == [("incremental_unassign", [(RETRY, 1, OFFSET_INVALID)])]
    readers.seek(TopicPartition(MAIN, 0, 5))  # a rewind while held
    readers.resume([TopicPartition(MAIN, 0), TopicPartition(RETRY, 1)])
    # A main partition is sought again where it was last sought, so that librdkafka fetches it
    # now rather than at its next one-second tick.
    assert member.made[-2:] == [("resume", [(MAIN, 0, OFFSET_INVALID)]),
                                ("seek", [(MAIN, 0, 5)])]
    assert reader.made[-1] == ("incremental_assign", [(RETRY, 1, 40)])
    readers.resume([TopicPartition(MAIN, 0)])  # resumed again with no seek since: no seek
    assert member.made[-1] == ("resume", [(MAIN, 0, OFFSET_INVALID)])
    readers.seek(TopicPartition(RETRY, 0, 3))  # a rewind of a partition being read
    assert reader.made[-1] == ("seek", [(RETRY, 0, 3)])


def test_a_held_partition_hands_back_what_it_fetched_and_is_assigned_again_after_it() -> None:
    readers, _, reader = started()
    fetched: list[Any] = [Message(RETRY, 1, offset=o) for o in range(40, 45)]
    other: Any = Message(RETRY, 0, offset=7)
    reader.queue = [fetched[0], other, *fetched[1:]]
    assert readers.consume_retries(10) == [fetched[0], other, *fetched[1:]]
    # 40 was handled; 41 is not due: held there, as Holds does it (pause, then seek).
    readers.pause([TopicPartition(RETRY, 1, 41)])
    readers.seek(TopicPartition(RETRY, 1, 41))
    assert reader.made[-1] == ("incremental_unassign", [(RETRY, 1, OFFSET_INVALID)])
    reader.made.clear()
    readers.resume([TopicPartition(RETRY, 1)])
    assert readers.consume_retries(10) == fetched[1:]  # what it kept, without a fetch
    # 41 was handled, 42 is not due: held again with no call to the client.
    readers.pause([TopicPartition(RETRY, 1, 42)])
    readers.seek(TopicPartition(RETRY, 1, 42))
    readers.resume([TopicPartition(RETRY, 1)])
    assert readers.consume_retries(10) == fetched[2:]
    assert reader.made == []
    # Handled through: assigned again after what it kept, so nothing is fetched twice.
    reader.queue = [Message(RETRY, 1, offset=45)]
    assert [m.offset() for m in readers.consume_retries(10)] == [45]
    assert reader.made == [("incremental_assign", [(RETRY, 1, 45)])]
    # Held at a record handed back by an earlier call (not in hand): nothing kept, so the
    # partition is read again from the held offset.
    readers.pause([TopicPartition(RETRY, 1, 43)])
    readers.resume([TopicPartition(RETRY, 1)])
    assert reader.made[-1] == ("incremental_assign", [(RETRY, 1, 43)])


def test_what_a_held_partition_kept_is_dropped_when_it_is_sought_elsewhere_or_revoked() -> None:
    readers, _, reader = started()
    reader.queue = [Message(RETRY, 1, offset=o) for o in range(40, 44)]
    readers.consume_retries(10)
    readers.pause([TopicPartition(RETRY, 1, 41)])
    readers.seek(TopicPartition(RETRY, 1, 30))  # a rewind to an earlier offset
    readers.resume([TopicPartition(RETRY, 1)])
    assert reader.made[-1] == ("incremental_assign", [(RETRY, 1, 30)])
    assert readers.consume_retries(10) == []
    reader.queue = [Message(RETRY, 1, offset=o) for o in range(30, 33)]
    readers.consume_retries(10)
    readers.pause([TopicPartition(RETRY, 1, 31)])
    readers.resume([TopicPartition(RETRY, 1)])
    readers.seek(TopicPartition(RETRY, 1, 20))  # rewound before what it kept was handed back
    reader.made.clear()
    assert readers.consume_retries(10) == []
    assert readers.consume_retries(10) == []
    assert reader.made == [("incremental_assign", [(RETRY, 1, 20)])]
    reader.queue = [Message(RETRY, 1, offset=o) for o in range(20, 23)]
    readers.consume_retries(10)
    readers.pause([TopicPartition(RETRY, 1, 21)])
    readers.resume([TopicPartition(RETRY, 1)])
    reader.made.clear()
    readers.revoked([TopicPartition(RETRY, 1)])
    assert reader.made == []  # unassigned already, while it hands back what it kept
    assert readers.consume_retries(10) == []  # what it kept went with it


def test_the_reader_rests_once_every_partition_reported_its_end() -> None:
    readers, _, reader = started()
    reader.made.clear()
    record: Any = Message(RETRY, 0)
    reader.queue = [record, Message(RETRY, 1, eof=True)]
    assert readers.consume_retries(10) == [record]  # partition 0 has not reported its end
    assert reader.made == []
    reader.positions = {(RETRY, 0): 12}
    reader.queue = [Message(RETRY, 0, eof=True)]
    assert readers.consume_retries(10) == []
    assert reader.made == [("incremental_unassign", [(RETRY, 0, OFFSET_INVALID),
                                                     (RETRY, 1, OFFSET_INVALID)])]
    reader.queue = [Message(RETRY, 0)]
    assert readers.consume_retries(10) == []  # resting: not even asked
    readers._wake_at = 0.0  # the rest is over
    assert len(readers.consume_retries(10)) == 1
    assert reader.made[-1] == ("incremental_assign", [(RETRY, 0, 12),
                                                      (RETRY, 1, OFFSET_INVALID)])
    assert readers_module.REST_S <= 0.05  # the most a rest adds to a retry's lateness


def test_revoked_retry_partitions_leave_the_reader_whether_held_resting_or_read() -> None:
    readers, _, reader = started()
    readers.pause([TopicPartition(RETRY, 1, 40)])
    reader.made.clear()
    readers.revoked([TopicPartition(MAIN, 0), TopicPartition(RETRY, 0),
                     TopicPartition(RETRY, 1)])
    assert reader.made == [("incremental_unassign", [(RETRY, 0, OFFSET_INVALID)])]
    assert not readers.reading_retries
    readers.resume([TopicPartition(RETRY, 1)])  # no longer held: nothing to assign
    assert reader.made[-1][0] == "incremental_unassign"


def test_without_retry_topics_there_is_no_reader() -> None:
    member = Client()
    readers = Readers(member, None, (), incremental=True)  # type: ignore[arg-type]
    readers.assigned([TopicPartition(MAIN, 0)])
    assert member.made == [] and not readers.reading_retries
    assert readers.consume_retries(10) == []


def test_retry_topics_found_later_open_the_reader_and_go_to_it_once_assigned() -> None:
    """An earlier policy's retry topic found as the consumer runs (redrive.former_looks), in a
    group that had none: the reader is opened then, and the member's next assignment of that
    topic's partitions goes to it, paused on the member."""
    member, opened = Client(), Client()
    made: list[Client] = []

    def open_reader() -> Client:
        made.append(opened)
        return opened

    readers = Readers(member, None, (), incremental=False,  # type: ignore[arg-type]
                      open_reader=open_reader)  # type: ignore[arg-type]
    readers.read_retry_topics([RETRY])
    assert made == [opened] and readers.reader is opened
    readers.assigned([TopicPartition(MAIN, 0), TopicPartition(RETRY, 0)])
    assert member.made == [("assign", [(MAIN, 0, -1001), (RETRY, 0, -1001)]),
                           ("pause", [(RETRY, 0, -1001)])]
    assert opened.made == [("incremental_assign", [(RETRY, 0, OFFSET_INVALID)])]
    assert readers.reading_retries
    readers.read_retry_topics(["orders.g.retry.1m"])  # a reader is opened once
    assert made == [opened]


def test_a_partition_woken_at_its_offset_rests_there_again_until_it_reads_a_record() -> None:
    # librdkafka's position() is OFFSET_INVALID after an assign at an offset or a seek, until a
    # record is consumed: resting then at "OFFSET_INVALID" went back to the committed offset and
    # read again every record handled since (seen while commits waited for their copies).
    readers, _, reader = started()
    reader.positions = {(RETRY, 0): 12, (RETRY, 1): 30}
    reader.queue = [Message(RETRY, 0, eof=True), Message(RETRY, 1, eof=True)]
    assert readers.consume_retries(10) == []
    readers._wake_at = 0.0
    reader.positions = {}  # placed again, nothing consumed since
    reader.queue = [Message(RETRY, 0, eof=True), Message(RETRY, 1, eof=True)]
    assert readers.consume_retries(10) == []
    readers._wake_at = 0.0
    reader.made.clear()
    readers.consume_retries(10)
    assert reader.made == [("incremental_assign", [(RETRY, 0, 12), (RETRY, 1, 30)])]


def test_a_rewound_or_resumed_partition_rests_where_it_was_placed() -> None:
    readers, _, reader = started()
    readers.seek(TopicPartition(RETRY, 0, 3))  # a rewind of a partition being read
    readers.pause([TopicPartition(RETRY, 1, 40)])
    readers.resume([TopicPartition(RETRY, 1)])
    reader.queue = [Message(RETRY, 0, eof=True), Message(RETRY, 1, eof=True)]
    assert readers.consume_retries(10) == []
    readers._wake_at = 0.0
    reader.made.clear()
    readers.consume_retries(10)
    assert reader.made == [("incremental_assign", [(RETRY, 0, 3), (RETRY, 1, 40)])]
    # A new assignment by the group starts again from the committed offset.
    readers.revoked([TopicPartition(RETRY, 0), TopicPartition(RETRY, 1)])
    readers.assigned([TopicPartition(RETRY, 0)])
    reader.queue = [Message(RETRY, 0, eof=True)]
    assert readers.consume_retries(10) == []
    readers._wake_at = 0.0
    reader.made.clear()
    readers.consume_retries(10)
    assert reader.made == [("incremental_assign", [(RETRY, 0, OFFSET_INVALID)])]


def test_a_resting_or_held_partition_held_again_is_not_unassigned_twice() -> None:
    # make test once ended run() so: a retry partition resting (unassigned) was held, and the
    # reader asked librdkafka to unassign it ("Can't subtract from empty assignment").
    readers, _, reader = started()
    reader.positions = {(RETRY, 0): 12, (RETRY, 1): 30}
    reader.queue = [Message(RETRY, 0, eof=True), Message(RETRY, 1, eof=True)]
    assert readers.consume_retries(10) == []  # both rest, unassigned
    reader.made.clear()
    readers.pause([TopicPartition(RETRY, 0, 12)])
    readers.seek(TopicPartition(RETRY, 0, 12))
    readers.pause([TopicPartition(RETRY, 0, 12)])  # held again while held
    assert reader.made == []
    readers._wake_at = 0.0
    readers.consume_retries(10)
    assert reader.made == [("incremental_assign", [(RETRY, 1, 30)])]  # not the held one
    readers.resume([TopicPartition(RETRY, 0)])
    assert reader.made[-1] == ("incremental_assign", [(RETRY, 0, 12)])


def test_records_of_retry_partitions_handed_to_the_member_are_left_to_the_reader() -> None:
    readers, member, _ = started()
    member.made.clear()
    main: list[Any] = [Message(MAIN, 0, offset=o) for o in range(3)]
    strays: list[Any] = [Message(RETRY, 1, offset=o) for o in range(2)]
    member.queue = [main[0], *strays, main[1], main[2]]
    assert readers.consume(10, 0, []) == main
    assert member.made == [("pause", [(RETRY, 1, OFFSET_INVALID)])]
    failed: Any = Message(RETRY, 0, eof=True)  # an error event is the run loop's to report
    member.queue = [main[0], failed]
    assert readers.consume(10, 0, []) == [main[0], failed]
    assert member.made == [("pause", [(RETRY, 1, OFFSET_INVALID)])]
    member.queue = list(main)
    assert readers.consume(10, 0, []) == main


def test_retry_records_in_hand_of_a_partition_a_callback_moved_are_not_handled() -> None:
    """A cooperative revoke settles the copies in flight inside the member's consume(): a copy
    refused holds the retry partitions kept at the batch's first record, an unanswered one
    rewinds them. The reader's records taken just before were handled and committed past it."""
    readers, member, reader = started()
    in_hand: list[Any] = [Message(RETRY, 0, offset=o) for o in (5, 6)] + [Message(RETRY, 1,
                                                                                  offset=3)]
    reader.queue = list(in_hand)
    retries = readers.consume_retries(10)
    main: list[Any] = [Message(MAIN, 0, offset=9)]

    def settled_in_callback(count: int, wait_s: float) -> list[Any]:
        readers.pause([TopicPartition(RETRY, 0, 2)])  # as Holds does it: pause, then seek
        readers.seek(TopicPartition(RETRY, 0, 2))
        return main

    member.consume = settled_in_callback  # type: ignore[method-assign]
    assert readers.consume(10, 0, retries) == [in_hand[2], *main]
    # Nothing moved in the next call: the records in hand all go on.
    member.consume = lambda count, wait_s: []  # type: ignore[method-assign]
    assert readers.consume(10, 0, [in_hand[2]]) == [in_hand[2]]
    # A rewind (seek) of a partition being read drops its records in hand too.
    member.consume = lambda count, wait_s: readers.seek(TopicPartition(RETRY, 1, 1)) or []
    assert readers.consume(10, 0, [in_hand[2]]) == []
