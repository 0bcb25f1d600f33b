"""redrive.kafka.transactions against the session broker: records and a group's offsets commit
together; a fatal producer error (injected through `make=`) aborts the transaction and renews the
producer, and the next run commits exactly once; an abortable error aborts without a new producer,
a retriable commit error is retried, unless the caller is stopping, when nothing is tried again or
renewed; a second producer with the same transactional id fences the first.

Exactly-once assertions: noida-db only (Tansu shows aborted records to read_committed readers)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from redrive import kafka
from redrive.dev.ports import free_port
from redrive.errors import BrokerUnavailable
from redrive.kafka.transactions import (
    ProducerFactory,
    ProducerFenced,
    TransactionAborted,
    TransactionalProducer,
)

from .conftest import DEADLINE_S, produce_values, read_partition, values_of

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]

NOTHING_COMMITTED = -1001  # OFFSET_INVALID: what committed() gives for a partition without one


class Group:
    """A consumer group member that read the input topic's records: the group and its metadata
    that a transaction commits offsets for."""

    def __init__(self, bootstrap: str, group: str, topic: str, count: int) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.member = kafka.consumer(bootstrap, group)
        self.member.subscribe([topic])
        self.consumed: list[Message] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(self.consumed) < count:
            assert time.monotonic() < deadline, f"consumed {len(self.consumed)} of {count}"
            message = self.member.poll(0.1)
            if message is not None:
                assert message.error() is None, message.error()
                self.consumed.append(message)

    def offsets(self) -> list[TopicPartition]:
        """The offsets after the consumed records, as a transaction commits them."""
        last: dict[int, int] = {}
        for message in self.consumed:
            last[int(message.partition() or 0)] = int(message.offset() or 0)
        return [TopicPartition(self.topic, p, offset + 1) for p, offset in sorted(last.items())]

    def metadata(self) -> Any:
        return self.member.consumer_group_metadata()

    def committed(self, partitions: Sequence[int] = (0,)) -> list[int]:
        """What the group committed, asked by a client that never joins it."""
        asking = kafka.consumer(self.bootstrap, self.group)
        try:
            return [tp.offset for tp in asking.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=DEADLINE_S)]
        finally:
            asking.close()

    def close(self) -> None:
        self.member.close()


def out_records(topic: str, values: Sequence[str]) -> list[kafka.OutRecord]:
    return [kafka.OutRecord(topic, value.encode(), b"key", [("attempt", value.encode())],
                            partition=0) for value in values]


def visible(bootstrap: str, topic: str) -> list[str]:
    """The partition's records as a read_committed reader sees them."""
    return values_of(read_partition(bootstrap, topic, 0))


def written(bootstrap: str, topic: str) -> list[str]:
    """Every record written to the partition, aborted ones included."""
    return values_of(read_partition(bootstrap, topic, 0, isolation="read_uncommitted"))


def failing_once(error: KafkaError, made: list[Producer], times: int = 1) -> ProducerFactory:
    """A `make=` factory whose producers' first commit_transaction (across all of them; the
    first `times`) sends the transaction's records to the broker and then fails with `error`."""
    left = [times]

    class FailingProducer(Producer):
        def commit_transaction(self, *args: Any) -> None:
            if left[0]:
                left[0] -= 1
                assert self.flush(DEADLINE_S) == 0
                raise KafkaException(error)
            super().commit_transaction(*args)

    def make(connection: kafka.Connection, *, transactional_id: str | None = None,
             overrides: Any = None) -> Producer:
        made.append(FailingProducer(kafka.producer_config(
            connection, transactional_id=transactional_id, overrides=overrides)))
        return made[-1]

    return make


def aborts_with_one_producer(transactions: TransactionalProducer, group: Group, sink: str,
                             made: list[Producer]) -> None:
    """A commit of one record fails with the injected error and is aborted by the one producer
    made: the record was written, none is visible, no offset was committed."""
    with pytest.raises(TransactionAborted, match="injected"):
        transactions.commit(out_records(sink, ["first"]), group.offsets(), group.metadata())
    assert transactions.renewed == 0 and len(made) == 1
    assert written(group.bootstrap, sink) == ["first"]
    assert visible(group.bootstrap, sink) == []
    assert group.committed() == [NOTHING_COMMITTED]


@pytest.fixture
def topics(bootstrap: str, new_topic: NewTopic) -> tuple[str, str]:
    """An input topic with three records and an empty output topic, one partition each."""
    source, sink = new_topic(1), new_topic(1)
    produce_values(bootstrap, source, ["in-0", "in-1", "in-2"])
    return source, sink


def test_a_run_commits_its_records_and_the_groups_offsets_together(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    transactions = TransactionalProducer(bootstrap, unique_name("txn"))
    seen_inside: dict[str, object] = {}

    def body(producer: Producer) -> int:
        for record in out_records(sink, ["out-0", "out-1"]):
            kafka.produce(producer, record)
        assert producer.flush(DEADLINE_S) == 0
        # Written, but part of an open transaction: nothing visible, nothing committed.
        seen_inside.update(written=written(bootstrap, sink), visible=visible(bootstrap, sink),
                           committed=group.committed())
        return 2

    try:
        transactions.start()
        assert transactions.run(body, group.offsets(), group.metadata()) == 2
        assert seen_inside == {"written": ["out-0", "out-1"], "visible": [],
                               "committed": [NOTHING_COMMITTED]}
        assert visible(bootstrap, sink) == ["out-0", "out-1"]
        assert group.committed() == [3]
        out = read_partition(bootstrap, sink, 0)
        assert [(m.offset(), m.key(), m.headers()) for m in out] == [
            (0, b"key", [("attempt", b"out-0")]), (1, b"key", [("attempt", b"out-1")])]

        # commit() is run() producing the given records.
        transactions.commit(out_records(sink, ["out-2"]), [TopicPartition(source, 0, 1)],
                            group.metadata())
        assert visible(bootstrap, sink) == ["out-0", "out-1", "out-2"]
        assert group.committed() == [1]
        assert transactions.renewed == 0
    finally:
        transactions.close()
        group.close()


def test_a_fatal_error_aborts_renews_the_producer_and_the_next_run_commits_exactly_once(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    transactional_id = unique_name("txn")
    made: list[Producer] = []
    injected = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "injected", fatal=True)
    transactions = TransactionalProducer(bootstrap, transactional_id,
                                         make=failing_once(injected, made))
    try:
        transactions.start()
        with pytest.raises(TransactionAborted) as aborted:
            transactions.commit(out_records(sink, ["first-0", "first-1"]), group.offsets(),
                                group.metadata())

        assert transactions.renewed == 1
        assert len(made) == 2 and transactions.producer is made[1]
        assert f"transactional.id={transactional_id!r} aborted" in str(aborted.value)
        assert "injected" in str(aborted.value)
        cause = aborted.value.__cause__
        assert isinstance(cause, KafkaException)
        assert cause.args[0].code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
        # The records reached the broker, but the new producer's start aborted their
        # transaction: a read_committed reader sees none of them, and no offset was committed.
        assert written(bootstrap, sink) == ["first-0", "first-1"]
        assert visible(bootstrap, sink) == []
        assert group.committed() == [NOTHING_COMMITTED]

        transactions.commit(out_records(sink, ["second-0", "second-1"]), group.offsets(),
                            group.metadata())

        assert visible(bootstrap, sink) == ["second-0", "second-1"]
        assert group.committed() == [3]
        assert transactions.renewed == 1 and len(made) == 2
    finally:
        transactions.close()
        group.close()


def test_an_abortable_error_aborts_with_the_same_producer(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    made: list[Producer] = []
    injected = KafkaError(KafkaError._TIMED_OUT, "injected", txn_requires_abort=True)
    transactions = TransactionalProducer(bootstrap, unique_name("txn"),
                                         make=failing_once(injected, made))
    try:
        transactions.start()
        aborts_with_one_producer(transactions, group, sink, made)

        transactions.commit(out_records(sink, ["second"]), group.offsets(), group.metadata())

        assert visible(bootstrap, sink) == ["second"]
        assert group.committed() == [3]
        assert transactions.renewed == 0 and len(made) == 1
    finally:
        transactions.close()
        group.close()


def test_a_retriable_commit_error_is_tried_again_and_commits_once(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName,
        caplog: pytest.LogCaptureFixture) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    made: list[Producer] = []
    transactional_id = unique_name("txn")
    injected = KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)
    transactions = TransactionalProducer(bootstrap, transactional_id,
                                         make=failing_once(injected, made))
    try:
        transactions.start()
        with caplog.at_level(logging.WARNING, logger="redrive.kafka.transactions"):
            transactions.commit(out_records(sink, ["only"]), group.offsets(), group.metadata())
        assert visible(bootstrap, sink) == ["only"]
        assert group.committed() == [3]
        assert transactions.renewed == 0 and len(made) == 1
        assert [r.getMessage() for r in caplog.records] == [
            f"committing the transaction of {transactional_id} failed (injected); trying again"]
    finally:
        transactions.close()
        group.close()


def test_a_commit_failing_as_retriable_for_long_is_resumed_until_it_commits_not_aborted(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName) -> None:
    """Given up after some tries, the abort conflicted with the commit librdkafka was still
    completing, and the caller, told the transaction aborted, wrote it again."""
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    made: list[Producer] = []
    injected = KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)
    transactions = TransactionalProducer(bootstrap, unique_name("txn"),
                                         make=failing_once(injected, made, times=6))
    try:
        transactions.start()
        transactions.commit(out_records(sink, ["only"]), group.offsets(), group.metadata())
        assert visible(bootstrap, sink) == ["only"]
        assert group.committed() == [3]
        assert transactions.renewed == 0 and len(made) == 1
    finally:
        transactions.close()
        group.close()


@pytest.mark.parametrize("injected", [
    KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "injected", fatal=True),
    KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)], ids=["fatal", "retriable"])
def test_while_stopping_a_failed_commit_is_not_tried_again_nor_the_producer_renewed(
        injected: KafkaError, bootstrap: str, topics: tuple[str, str],
        unique_name: UniqueName) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    made: list[Producer] = []
    stopping = threading.Event()
    transactions = TransactionalProducer(bootstrap, unique_name("txn"), timeout_s=7,
                                         make=failing_once(injected, made), stopping=stopping)
    try:
        transactions.start()
        stopping.set()
        aborts_with_one_producer(transactions, group, sink, made)
    finally:
        transactions.close()
        group.close()


def test_the_producers_requests_time_out_with_its_calls_unless_the_user_says_otherwise(
        unique_name: UniqueName) -> None:
    seen: list[Any] = []

    def make(connection: kafka.Connection, *, transactional_id: str | None = None,
             overrides: Any = None) -> Producer:
        seen.append(overrides)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "not started in this test"))

    user = {"bootstrap.servers": "127.0.0.1:9", "socket.timeout.ms": 50_000}
    for connection, overrides in (("127.0.0.1:9", None), ("127.0.0.1:9",
                                  {"socket.timeout.ms": 45_000}), (user, None)):
        with pytest.raises(KafkaException):
            TransactionalProducer(connection, unique_name("txn"), timeout_s=7,
                                  overrides=overrides, make=make).start()
    assert [o.get("socket.timeout.ms") for o in seen] == [7_000, 45_000, None]


def test_a_start_no_broker_answers_names_the_bootstrap_and_the_transactional_id(
        unique_name: UniqueName) -> None:
    # A runtime starting while the brokers are down (or frozen) ended with librdkafka's
    # "Timed out waiting for operation to finish, retry call to resume" and nothing else.
    address = f"127.0.0.1:{free_port()}"
    transactional_id = unique_name("txn")
    transactions = TransactionalProducer(address, transactional_id, timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as raised:
        transactions.start()
    assert time.monotonic() - started < 10
    assert raised.value.bootstrap == address
    assert f"transactional.id={transactional_id!r}" in str(raised.value)
    assert "got no answer in 1.5 s" in str(raised.value)
    with pytest.raises(TransactionAborted, match="not started"):
        _ = transactions.producer


def test_an_exception_of_the_body_aborts_and_propagates(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    transactions = TransactionalProducer(bootstrap, unique_name("txn"))

    def body(producer: Producer) -> None:
        kafka.produce(producer, out_records(sink, ["half-done"])[0])
        assert producer.flush(DEADLINE_S) == 0
        raise LookupError("handler bug")

    try:
        transactions.start()
        with pytest.raises(LookupError, match="handler bug"):
            transactions.run(body, group.offsets(), group.metadata())
        assert written(bootstrap, sink) == ["half-done"]
        assert visible(bootstrap, sink) == []
        assert group.committed() == [NOTHING_COMMITTED]

        transactions.commit(out_records(sink, ["whole"]), group.offsets(), group.metadata())
        assert visible(bootstrap, sink) == ["whole"]
        assert group.committed() == [3]
        assert transactions.renewed == 0
    finally:
        transactions.close()
        group.close()


@pytest.mark.parametrize("with_records", [True, False], ids=["records", "offsets-only"])
def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
        bootstrap: str, topics: tuple[str, str], unique_name: UniqueName,
        with_records: bool) -> None:
    source, sink = topics
    group = Group(bootstrap, unique_name("group"), source, 3)
    transactional_id = unique_name("txn")
    older = TransactionalProducer(bootstrap, transactional_id)
    newer = TransactionalProducer(bootstrap, transactional_id)
    try:
        older.start()
        older.commit(out_records(sink, ["older-0"]))
        newer.start()

        with pytest.raises(ProducerFenced) as fenced:
            older.commit(out_records(sink, ["older-1"]) if with_records else [],
                         group.offsets(), group.metadata())

        assert fenced.value.transactional_id == transactional_id
        assert str(fenced.value).startswith(f"transactional.id={transactional_id!r} was fenced")
        # The fenced producer did not start a new one, which would fence the newer in turn, and
        # stays fenced; closing it does not raise.
        assert older.renewed == 0
        with pytest.raises(ProducerFenced):
            older.commit(out_records(sink, ["older-2"]))
        older.close()
        assert group.committed() == [NOTHING_COMMITTED]
        newer.commit(out_records(sink, ["newer-0"]), group.offsets(), group.metadata())
        assert visible(bootstrap, sink) == ["older-0", "newer-0"]
        assert group.committed() == [3]
        assert newer.renewed == 0
    finally:
        older.close()
        newer.close()
        group.close()
