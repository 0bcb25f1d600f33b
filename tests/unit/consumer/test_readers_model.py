"""The retry reader driven as the run loop drives it, by random sequences of fetches, holds,
releases, rewinds, rests and rebalances, against a stand-in that refuses what librdkafka refuses:
assigning a partition twice, unassigning one it does not have, seeking one it does not have.

Checked at every step: the handler sees each partition's records in order from where it was last
held or rewound, no record of a held partition is handed out, and once the holds are released
every record is handled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from redrive.consumer import readers as readers_module
from redrive.consumer.readers import Readers

MAIN, RETRY = "orders", "orders.g.retry.5s"
RETRY_TPS = [(RETRY, 0), (RETRY, 1)]


class Record:
    def __init__(self, tp: tuple[str, int], offset: int, eof: bool = False) -> None:
        self._tp, self._offset, self._eof = tp, offset, eof

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None


class Member:
    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    resume = assign = incremental_assign = pause

    def seek(self, partition: TopicPartition) -> None:
        pass


class StrictReader:
    """An assign-only consumer over `log` (records per partition) that starts a partition
    assigned at OFFSET_INVALID at `committed`, as librdkafka does."""

    def __init__(self, log: dict[tuple[str, int], int], committed: dict[tuple[str, int], int]
                 ) -> None:
        self.log, self.committed = log, committed
        self.next: dict[tuple[str, int], int] = {}  # assigned partition -> next fetch offset
        self.consumed: set[tuple[str, int]] = set()  # consumed a record since it was placed
        self.eof_at: dict[tuple[str, int], int] = {}  # where its end was last reported

    @staticmethod
    def _key(p: TopicPartition) -> tuple[str, int]:
        return (p.topic, p.partition)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            if self._key(p) in self.next:
                raise KafkaException(KafkaError(KafkaError._CONFLICT, f"{p} is assigned"))
        for p in partitions:
            self.next[self._key(p)] = p.offset
            self.consumed.discard(self._key(p))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        if not self.next:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                            "Can't subtract from empty assignment"))
        for p in partitions:
            if self._key(p) not in self.next:
                raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"{p} not assigned"))
        for p in partitions:
            del self.next[self._key(p)]
            self.eof_at.pop(self._key(p), None)

    def seek(self, partition: TopicPartition) -> None:
        key = self._key(partition)
        if key not in self.next:
            raise KafkaException(KafkaError(KafkaError._STATE, f"{partition} not assigned"))
        self.next[key] = partition.offset
        self.consumed.discard(key)
        self.eof_at.pop(key, None)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition,
                               self.next[self._key(p)] if self._key(p) in self.consumed
                               else OFFSET_INVALID) for p in partitions]

    def consume(self, count: int, wait_s: float) -> list[Record]:
        found: list[Record] = []
        for tp in sorted(self.next):
            if self.next[tp] == OFFSET_INVALID:
                self.next[tp] = self.committed[tp]
            while self.next[tp] < self.log[tp] and len(found) < count:
                found.append(Record(tp, self.next[tp]))
                self.next[tp] += 1
                self.consumed.add(tp)
            if self.next[tp] == self.log[tp] and self.eof_at.get(tp) != self.next[tp]:
                self.eof_at[tp] = self.next[tp]
                found.append(Record(tp, -1, eof=True))
        return found


class ReaderModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.log = {tp: 0 for tp in RETRY_TPS}
        self.expected = {tp: 0 for tp in RETRY_TPS}  # the next offset the handler must see
        self.committed = dict(self.expected)
        self.held: set[tuple[str, int]] = set()
        self.reader = StrictReader(self.log, self.committed)
        self.readers = Readers(Member(), self.reader, [RETRY],  # type: ignore[arg-type]
                               incremental=False)
        self.readers.assigned(self._all())
        readers_module.time = SimpleNamespace(  # type: ignore[attr-defined,assignment]
            monotonic=lambda: self.now)

    @staticmethod
    def _all() -> list[TopicPartition]:
        return [TopicPartition(MAIN, 0)] + [TopicPartition(*tp) for tp in RETRY_TPS]

    def _release(self, tps: list[tuple[str, int]]) -> None:
        held = [tp for tp in tps if tp in self.held]
        self.held.difference_update(held)
        if held:
            self.readers.resume([TopicPartition(*tp) for tp in held])

    def _rebalance(self) -> None:
        # As the runtime's revoke and assign callbacks do (an eager protocol: all, then all).
        self._release(RETRY_TPS)
        self.readers.revoked(self._all())
        self.readers.assigned(self._all())

    @rule(partition=st.sampled_from([0, 1]), count=st.integers(1, 4))
    def produce(self, partition: int, count: int) -> None:
        self.log[(RETRY, partition)] += count

    @rule(count=st.integers(1, 6), holds=st.lists(st.booleans(), max_size=8),
          rebalance_in_between=st.booleans())
    def run_once(self, count: int, holds: list[bool], rebalance_in_between: bool) -> None:
        """One turn of the run loop: take the retry records, then (the member's poll may run
        rebalance callbacks first) handle them in order, holding a partition at some of them."""
        records = self.readers.consume_retries(count)
        for record in records:
            tp = (str(record.topic()), int(record.partition()))  # type: ignore[arg-type]
            assert tp not in self.held, f"record {record.offset()} of held {tp} handed out"
        if rebalance_in_between:
            self._rebalance()
        stopped: set[tuple[str, int]] = set()
        decisions = iter(holds)
        for record in records:
            tp = (str(record.topic()), int(record.partition()))  # type: ignore[arg-type]
            if tp in stopped:
                continue
            assert record.offset() == self.expected[tp], (tp, record.offset(), self.expected)
            if next(decisions, False):
                # Holds.hold: pause, then seek back to the record.
                position = TopicPartition(tp[0], tp[1], self.expected[tp])
                self.readers.pause([position])
                self.readers.seek(position)
                self.held.add(tp)
                stopped.add(tp)
            else:
                self.expected[tp] += 1
        self.committed.update(self.expected)

    @rule(partition=st.sampled_from([0, 1]))
    def hold_out_of_turn(self, partition: int) -> None:
        """A hold at the partition's next record while it is in any state (held already,
        resting, handing back what it kept): not the run loop's usual order, but one the
        reader must take without a call librdkafka refuses (make test once failed so, holding
        a resting partition)."""
        tp = (RETRY, partition)
        position = TopicPartition(RETRY, partition, self.expected[tp])
        self.readers.pause([position])
        self.readers.seek(position)
        self.held.add(tp)

    @rule(partition=st.sampled_from([0, 1]))
    def release(self, partition: int) -> None:
        self._release([(RETRY, partition)])

    @rule(partition=st.sampled_from([0, 1]), back=st.integers(0, 3))
    def rewind(self, partition: int, back: int) -> None:
        """The committer's rewind after a batch's copies failed: back to its first record."""
        tp = (RETRY, partition)
        offset = max(self.committed[tp] - back, 0)
        self.expected[tp] = self.committed[tp] = offset
        self.readers.seek(TopicPartition(RETRY, partition, offset))

    @rule()
    def rest_over(self) -> None:
        self.now += readers_module.REST_S

    @rule()
    def rebalance(self) -> None:
        self._rebalance()

    @invariant()
    def reading_retries(self) -> None:
        assert self.readers.reading_retries

    def teardown(self) -> None:
        self._release(RETRY_TPS)
        for _ in range(20):
            self.now += readers_module.REST_S
            self.run_once(10, [], False)
        assert self.expected == self.log, (self.expected, self.log)


@pytest.fixture(autouse=True)
def _real_clock() -> Any:
    real = readers_module.time  # type: ignore[attr-defined]
    yield
    readers_module.time = real  # type: ignore[attr-defined]


ReaderModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                         deadline=None)
test_reader_model = ReaderModel.TestCase
