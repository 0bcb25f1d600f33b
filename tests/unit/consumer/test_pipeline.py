"""Pipelined confirmations: copies are confirmed while later batches are handled, offsets are
committed strictly in batch order, a failed delivery rewinds and loses nothing, and a revoke
commits what was acknowledged and nothing else. The runtime is driven with fake clients."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive import headers as h
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.consumer.batch import Copy
from redrive.consumer.commits import CommitPipeline, Pending
from redrive.consumer.committer import Committer
from redrive.consumer.readers import Readers
from redrive.errors import DeliveryFailed
from redrive.kafka import OutRecord
from redrive.kafka.transactions import TransactionAborted
from redrive.policy import Backoff, ErrorMatcher, RetryPolicy, predicate
from redrive.record import Origin, Record
from redrive.routing import DeadLetter

from ..fakes import FakeMessage

A, B, C = ("orders", 0), ("orders", 1), ("orders", 2)
DEAD = DeadLetter(None, [], "exhausted", 3, 0)


def copy_of(tp: tuple[str, int], offset: int) -> Copy:
    return Copy(OutRecord("orders.g.dlt", f"{tp[1]}-{offset}".encode()), DEAD, "orders", tp,
                offset)


def sent(pending: Pending) -> list[Callable[[Any, Any], None]]:
    """Produce each of the batch's copies (as the committer does): their delivery callbacks."""
    reports = []
    for index, copy in enumerate(pending.copies):
        if copy.record is not None:
            reports.append(pending.reporter(index))
            pending.sent()
    return reports


def landed(report: Callable[[Any, Any], None]) -> None:
    report(None, FakeMessage("orders.g.dlt", 0))


def test_acknowledged_batches_commit_in_order_and_wait_for_earlier_ones() -> None:
    pipeline = CommitPipeline()
    copy = copy_of(A, 3)
    first, second = Pending({A: 10}, {A: 0}, [copy]), Pending({A: 20, B: 5}, {A: 10, B: 0})
    [report] = sent(first)
    pipeline.add(first)
    pipeline.add(second)  # no copies of its own, but behind an unconfirmed batch
    assert pipeline.settle().commit == {}
    landed(report)
    settled = pipeline.settle()
    assert settled.commit == {A: 20, B: 5} and settled.confirmed == [copy]
    assert settled.error is None and not pipeline


def test_a_failed_delivery_drops_its_batch_and_all_later_ones_and_says_where_to_rewind() -> None:
    pipeline = CommitPipeline()
    ok, failed, later = (Pending({A: 10}, {A: 0}, [copy_of(A, 2)]),
                         Pending({A: 20}, {A: 10}, [copy_of(A, 10)]),
                         Pending({A: 30, B: 7}, {A: 20, B: 3}, [copy_of(B, 4)]))
    [ok_report], [failed_report], [later_report] = (sent(p) for p in (ok, failed, later))
    for pending in (ok, failed, later):
        pipeline.add(pending)
    landed(later_report)
    failed_report(refused("broker said no"), FakeMessage("orders.g.retry.1s", 0))
    assert pipeline.settle().commit == {}  # the first batch is still unconfirmed
    landed(ok_report)
    settled = pipeline.settle()
    assert settled.commit == {A: 10}
    assert settled.rewind == {A: 10, B: 3}  # the earliest dropped record per partition
    assert isinstance(settled.error, DeliveryFailed) and "broker said no" in str(settled.error)
    assert not pipeline


def test_a_failed_batch_commits_each_partitions_records_before_its_first_copy_not_landed() -> None:
    pipeline = CommitPipeline()
    a2, a5, a7, b1, c3 = (copy_of(A, 2), copy_of(A, 5), copy_of(A, 7), copy_of(B, 1),
                          copy_of(C, 3))
    failed = Pending({A: 10, B: 4, C: 6}, {A: 0, B: 0, C: 3}, [a2, b1, a5, c3, a7])
    reports = sent(failed)
    pipeline.add(failed)
    later = Pending({A: 12}, {A: 10})
    pipeline.add(later)
    landed(reports[0])  # A's 2
    landed(reports[1])  # B's 1
    reports[2](refused("too large"), FakeMessage("orders.g.dlt", 0))  # A's 5
    landed(reports[4])  # A's 7, past the refused one: handled again all the same
    # C's 3 is not answered yet
    settled = pipeline.settle()
    assert settled.commit == {A: 5, B: 4}  # C's first record is the one not answered
    assert settled.confirmed == [a2, b1]
    assert settled.rewind == {A: 5, C: 3}  # B is done: the later batch has none of it
    assert settled.culprits == {A}  # C's copy was not refused: C is read again at once
    assert not pipeline


def test_the_culprits_of_a_failure_are_the_partitions_whose_copies_failed() -> None:
    pipeline = CommitPipeline()
    failed = Pending({A: 20, B: 4}, {A: 10, B: 0}, [copy_of(A, 12)])
    later = Pending({A: 30, B: 7}, {A: 20, B: 4}, [copy_of(B, 5)])
    [failed_report], _ = sent(failed), sent(later)
    for pending in (failed, later):
        pipeline.add(pending)
    failed_report(refused("too large"), FakeMessage("orders.g.dlt", 0))
    settled = pipeline.settle()
    assert settled.commit == {A: 12, B: 4}
    assert settled.rewind == {A: 12, B: 4}
    assert settled.culprits == {A}  # the later batch's copies were not refused


def test_a_copy_that_could_not_be_produced_stops_its_partition_there() -> None:
    pipeline = CommitPipeline()
    failed = Pending({A: 5}, {A: 0}, [copy_of(A, 1), copy_of(A, 3)])
    first_report = failed.reporter(0)  # the first went out, the second could not
    failed.sent()
    failed.fail(DeliveryFailed("orders.g.dlt", None, "refused at once"), 1)
    pipeline.add(failed)
    landed(first_report)
    settled = pipeline.settle()
    assert settled.commit == {A: 3} and settled.rewind == {A: 3} and settled.culprits == {A}


def test_a_partition_whose_copy_failed_behind_one_still_unanswered_is_held_from_that_one() -> None:
    pipeline = CommitPipeline()
    failed = Pending({A: 5}, {A: 0}, [copy_of(A, 1), copy_of(A, 3)])
    reports = sent(failed)
    pipeline.add(failed)
    reports[1](refused("too large"), FakeMessage("orders.g.dlt", 0))
    settled = pipeline.settle()  # not waiting for the first copy's answer
    assert settled.commit == {A: 1} and settled.rewind == {A: 1} and settled.culprits == {A}


def test_a_refusal_at_a_partitions_first_record_commits_nothing_of_it() -> None:
    # A commit would forget the partition's refusals: its pauses would not grow.
    pipeline = CommitPipeline()
    failed = Pending({A: 8}, {A: 5}, [copy_of(A, 5)])
    [report] = sent(failed)
    pipeline.add(failed)
    report(refused("too large"), FakeMessage("orders.g.dlt", 0))
    settled = pipeline.settle()
    assert settled.commit == {} and settled.rewind == {A: 5} and settled.culprits == {A}


def test_unconfirmed_past_the_timeout_counts_as_failed() -> None:
    pipeline = CommitPipeline()
    pending = Pending({A: 10}, {A: 4}, [copy_of(A, 4)], since=100.0)
    sent(pending)
    pipeline.add(pending)
    pipeline.expire(now_s=105.0, timeout_s=30.0)
    assert pipeline.settle().error is None
    pipeline.expire(now_s=130.0, timeout_s=30.0)
    settled = pipeline.settle()
    assert settled.error is not None and settled.rewind == {A: 4} and settled.commit == {}
    assert settled.culprits == set()


def test_lost_partitions_are_not_committed() -> None:
    pipeline = CommitPipeline()
    pipeline.add(Pending({A: 10, B: 3}, {A: 0, B: 0}))
    assert pipeline.settle(exclude=[B]).commit == {A: 10}


# --- the runtime with fake clients ----------------------------------------------------------


def refused(text: str) -> KafkaError:
    return KafkaError(KafkaError.INVALID_RECORD, text)


class FakeProducer:
    """Keeps every delivery report until the test decides how each copy fares."""

    def __init__(self) -> None:
        self.waiting: list[tuple[str, bytes, Callable[[Any, Any], None]]] = []
        self.fail_values: set[bytes] = set()
        self.failure = refused("broker said no")
        self.purged = False

    def purge(self) -> None:
        self.purged = True

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.waiting.append((topic, kwargs["value"], kwargs["on_delivery"]))

    def deliver(self, values: Iterable[bytes] | None = None) -> None:
        """Report on the copies of these values (all when None), failing those in fail_values."""
        keep = []
        for topic, value, callback in self.waiting:
            if values is None or value in values:
                error = self.failure if value in self.fail_values else None
                callback(error, FakeMessage(topic, 0))
            else:
                keep.append((topic, value, callback))
        self.waiting = keep

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        self.deliver()
        return 0


class FakeConsumer:
    def __init__(self) -> None:
        self.seek_error: KafkaError | None = None
        self.commits: list[dict[tuple[str, int], int]] = []  # asynchronous: each batch's
        self.synced: list[dict[tuple[str, int], int]] = []  # synchronous: on revoke and close
        self.seeks: list[tuple[str, int, int]] = []
        # The member's on_commit callback, which consume() calls for each asynchronous commit
        # not answered yet (as librdkafka does from poll); None: the coordinator never answers.
        self.on_commit: Callable[[KafkaError | None, list[Any]], None] | None = None
        self.unanswered: list[list[Any]] = []
        self.paused: list[Any] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> list[Any] | None:
        (self.commits if asynchronous else self.synced).append(
            {(p.topic, p.partition): p.offset for p in offsets})
        if asynchronous:
            self.unanswered.append(offsets)
        return None if asynchronous else offsets  # each with error None

    def assignment(self) -> list[Any]:
        return [_Partition(*A), _Partition(*B)]

    def consume(self, count: int, timeout: float) -> list[Any]:
        if self.on_commit is None:
            time.sleep(timeout)
            return []
        while self.unanswered:
            self.on_commit(None, self.unanswered.pop(0))
        return []

    def seek(self, partition: Any) -> None:
        if self.seek_error is not None:
            raise KafkaException(self.seek_error)
        self.seeks.append((partition.topic, partition.partition, partition.offset))

    def resume(self, partitions: list[Any]) -> None:
        pass

    def pause(self, partitions: list[Any]) -> None:
        self.paused.extend((p.topic, p.partition) for p in partitions)

    def close(self) -> None:
        pass


def _fake_runtime(fails: set[bytes], *, holds: bool = False,
                  handler: Callable[[Record], None] | None = None,
                  not_retryable: ErrorMatcher | None = None,
                  ) -> tuple[RetryingConsumer, FakeConsumer, FakeProducer]:
    def failing(record: Record) -> None:
        if record.value in fails and record.delivery.attempt == 0:
            raise RuntimeError("transient")

    runtime = RetryingConsumer("localhost:9", "orders", "g", RetryPolicy(
        backoff=Backoff.fixed("1s"), attempts=3, not_retryable=not_retryable),
        handler or failing)
    consumer, producer = FakeConsumer(), FakeProducer()
    readers = Readers(consumer, None, (), incremental=False)  # type: ignore[arg-type]
    runtime._consumer = readers
    runtime._committer = Committer("g", readers, runtime._backend,
                                   runtime.metrics, runtime._assigned, 30.0, runtime.health,
                                   producer=producer,  # type: ignore[arg-type]
                                   holds=runtime._holds if holds else None,
                                   stopping=runtime._stopping)
    runtime._partitions = {"orders.g.retry.1s": 2, "orders.g.dlt": 2}
    runtime._assigned.update([A, B])
    consumer.on_commit = runtime._committer.committed
    return runtime, consumer, producer


def _batch(partition: int, offsets: range) -> list[Any]:
    return [FakeMessage("orders", partition, o, f"{partition}-{o}".encode()) for o in offsets]


def test_runtime_commits_only_after_every_earlier_copy_is_acknowledged() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1", b"0-6", b"1-2"})
    runtime._handle_batch(_batch(0, range(0, 5)) + _batch(1, range(0, 3)))
    runtime._handle_batch(_batch(0, range(5, 10)))
    assert consumer.commits == []  # nothing acknowledged yet: nothing committed
    producer.deliver([b"0-6"])  # the second batch's copy first
    runtime._require_committer().settle()
    assert consumer.commits == []  # still behind the first batch
    producer.deliver()
    runtime._require_committer().settle()
    assert consumer.commits == [{A: 10, B: 3}]
    assert runtime.metrics.total("redrive_retried_total") == 3
    assert runtime.metrics.total("redrive_processed_total") == 10


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__("the call failed")  # errors that print alike, from the same line
        self.status = status


def test_a_predicate_on_the_live_exception_decides_each_failure_of_a_batch() -> None:
    def call(record: Record) -> None:
        raise ApiError(int(record.value or b"0"))

    permanent = predicate(lambda error: getattr(error.exception, "status", 0) == 400)
    runtime, _, producer = _fake_runtime(set(), handler=call, not_retryable=permanent)
    values = [b"400", b"503", b"503", b"400"]
    runtime._handle_batch([FakeMessage("orders", 0, offset, value)
                           for offset, value in enumerate(values)])
    assert [(topic, value) for topic, value, _ in producer.waiting] == [
        ("orders.g.dlt", b"400"), ("orders.g.retry.1s", b"503"),
        ("orders.g.retry.1s", b"503"), ("orders.g.dlt", b"400")]


def test_a_delivery_failure_mid_pipeline_rewinds_and_loses_nothing() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1", b"0-6", b"0-12", b"1-7"})
    producer.fail_values = {b"0-6"}
    runtime._handle_batch(_batch(0, range(0, 5)))  # acknowledged
    runtime._handle_batch(_batch(0, range(5, 10)) + _batch(1, range(0, 4)))  # a copy fails
    runtime._handle_batch(_batch(0, range(10, 15)) + _batch(1, range(4, 8)))  # fine, but later
    producer.deliver()
    runtime._require_committer().settle()
    # The first batch, and the failed one up to the refused copy's record.
    assert consumer.commits == [{A: 6, B: 4}]
    assert sorted(consumer.seeks) == [("orders", 0, 6), ("orders", 1, 4)]
    assert not runtime._require_committer().unconfirmed
    assert runtime.metrics.total("redrive_retried_total") == 1
    # Handled again from the rewind, everything goes through and is committed.
    producer.fail_values = set()
    runtime._handle_batch(_batch(0, range(6, 15)) + _batch(1, range(4, 8)))
    producer.deliver()
    runtime._require_committer().settle()
    assert consumer.commits[-1] == {A: 15, B: 8}


def test_a_refused_copy_holds_its_partition_with_growing_pauses_the_others_go_on() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1"}, holds=True)
    committer, holds = runtime._require_committer(), runtime._holds
    producer.fail_values = {b"0-1"}
    runtime._handle_batch(_batch(0, range(0, 3)) + _batch(1, range(0, 3)))
    producer.deliver()
    committer.settle()
    # What came before the refused copy's record is done: A's record 0, and all of B, which
    # is neither sought nor held.
    assert consumer.commits == [{A: 1, B: 3}]
    for pause_s in (1.0, 2.0, 4.0):
        # A waits at the refused copy's record, longer each time.
        assert consumer.seeks == [("orders", 0, 1)]
        assert A in holds and B not in holds
        assert pause_s - 0.1 <= holds.wait_s(now_ms(), 100.0) <= pause_s
        holds.release(runtime._require_consumer(), [A])
        consumer.seeks.clear()
        runtime._handle_batch(_batch(0, range(1, 3)))
        producer.deliver()
        committer.settle()
        assert consumer.commits[1:] == []  # nothing moved: the pauses are not forgotten
    producer.fail_values = set()
    consumer.seeks.clear()
    runtime._handle_batch(_batch(0, range(1, 3)) + _batch(1, range(3, 5)))
    producer.deliver()
    committer.settle()
    assert consumer.commits[1:] == [{A: 3, B: 5}]
    # Committed, A starts afresh: a new refusal waits 1 s again.
    runtime._handle_batch([FakeMessage("orders", 0, 5, b"0-1")])
    producer.fail_values = {b"0-1"}
    producer.deliver()
    committer.settle()
    assert 0.9 <= holds.wait_s(now_ms(), 100.0) <= 1.0


def test_revoke_commits_what_is_acknowledged_and_nothing_else() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1", b"1-1", b"0-6"})
    producer.fail_values = {b"1-1"}
    runtime._handle_batch(_batch(0, range(0, 5)))
    runtime._handle_batch(_batch(1, range(0, 5)))  # its copy will fail
    runtime._handle_batch(_batch(0, range(5, 10)))
    assert consumer.commits == []
    partitions = [_Partition(*A), _Partition(*B)]
    runtime._on_revoke(consumer, partitions)  # type: ignore[arg-type]
    # Acknowledged before the failure, and B's record before its refused copy; nothing after.
    assert consumer.commits == [{A: 5, B: 1}]
    assert consumer.synced == [{A: 5, B: 1}]  # and committed again, waiting, for the next owner
    assert not runtime._require_committer().unconfirmed and runtime._assigned == set()


def test_a_cooperative_revoke_treats_a_kept_partitions_refused_copy_as_any_refusal() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1"}, holds=True)
    producer.fail_values = {b"0-1"}  # the copy of A's record 1 is refused
    runtime._handle_batch(_batch(0, range(0, 5)))
    runtime._on_revoke(consumer, [_Partition(*B)])  # type: ignore[list-item]
    assert runtime._assigned == {A}
    assert consumer.seeks == [("orders", 0, 1)] and consumer.paused == [A]  # held at record 1
    # Record 0 is committed, synchronously too, as all that is owed is on a revoke.
    assert consumer.commits == [{A: 1}] and consumer.synced == [{A: 1}]


def test_a_kept_partition_that_cannot_be_rewound_in_a_revoke_ends_the_run() -> None:
    # Read on from where it stood, its next commit would pass the record whose copy failed.
    runtime, consumer, producer = _fake_runtime({b"0-1"})
    producer.fail_values = {b"0-1"}
    runtime._handle_batch(_batch(0, range(0, 5)))
    consumer.seek_error = KafkaError(KafkaError._STATE, "Erroneous state")
    with pytest.raises(KafkaException, match="Erroneous state"):
        runtime._on_revoke(consumer, [_Partition(*B)])  # type: ignore[list-item]
    assert consumer.commits == [{A: 1}] and consumer.synced == []  # record 0 only


def test_a_synchronous_commit_does_not_count_as_an_answered_asynchronous_one() -> None:
    # close() waits for the asynchronous commits still in flight; a revoke's synchronous commit
    # counted as one of them, and a close after it stopped waiting for an unanswered one.
    runtime, consumer, producer = _fake_runtime({b"0-1"})
    runtime._handle_batch(_batch(0, range(0, 5)))
    producer.deliver()
    committer = runtime._require_committer()
    committer.settle()
    assert consumer.commits == [{A: 5}] and committer._in_flight == 1
    runtime._on_revoke(consumer, [_Partition(*B)])  # type: ignore[list-item]
    assert consumer.synced == [{A: 5}]
    assert committer._in_flight == 1  # still unanswered


def test_a_stop_ends_the_wait_for_the_oldest_unconfirmed_batch() -> None:
    # The brokers away with nine batches unconfirmed: the loop waited for the oldest until its
    # timeout (30 s here) before it saw a SIGTERM, and the close waited again after that.
    runtime, consumer, producer = _fake_runtime({b"0-%d" % o for o in range(0, 50, 5)})
    runtime._stopping.set()
    started = time.monotonic()
    for first in range(0, 50, 5):
        runtime._handle_batch(_batch(0, range(first, first + 5)))
    assert time.monotonic() - started < 5.0
    assert len(producer.waiting) == 10 and consumer.commits == []


def test_lost_partitions_commit_nothing_of_theirs() -> None:
    runtime, consumer, _ = _fake_runtime({b"0-1", b"1-1"})
    runtime._handle_batch(_batch(0, range(0, 5)) + _batch(1, range(0, 5)))
    runtime._on_lost(consumer, [_Partition(*B)])  # type: ignore[arg-type, list-item]
    assert consumer.commits == [{A: 5}]
    assert consumer.synced == [{A: 5}]


def test_close_commits_the_acknowledged_batches() -> None:
    runtime, consumer, _ = _fake_runtime({b"0-1"})
    runtime._handle_batch(_batch(0, range(0, 5)))
    runtime.close()
    # Once more on the way out, without waiting (a synchronous commit waits for as long as the
    # coordinator does not answer), then the answers are served with the partitions paused.
    assert consumer.commits == [{A: 5}, {A: 5}]
    assert consumer.synced == []
    assert consumer.unanswered == []
    assert set(consumer.paused) == {A, B}


def test_the_revoke_inside_the_consumers_close_commits_nothing_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, consumer, _ = _fake_runtime({b"0-1"})
    runtime._handle_batch(_batch(0, range(0, 5)))
    partitions = [_Partition(*A), _Partition(*B)]
    # librdkafka's close() runs the rebalance callback: here, with the partitions revoked.
    monkeypatch.setattr(consumer, "close", lambda: runtime._on_revoke(
        consumer, partitions))  # type: ignore[arg-type]
    runtime.close()
    assert consumer.commits == [{A: 5}, {A: 5}]
    assert consumer.synced == []  # a synchronous commit would wait out a frozen coordinator
    assert runtime._assigned == set()


def test_close_gives_up_on_unanswered_commits_at_its_deadline(
        caplog: pytest.LogCaptureFixture) -> None:
    runtime, consumer, _ = _fake_runtime({b"0-1"})
    consumer.on_commit = None
    runtime._timeout_s = 0.3
    runtime._handle_batch(_batch(0, range(0, 5)))
    started = time.monotonic()
    runtime.close()
    assert 0.3 <= time.monotonic() - started < 1.0
    assert consumer.commits == [{A: 5}, {A: 5}]
    assert len(consumer.unanswered) == 2
    assert "2 commits were not answered in time" in caplog.text


class _Partition:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


def test_failed_records_leave_no_reference_cycles() -> None:
    # A live exception kept in the frame that caught it is a cycle through its traceback, holding
    # that frame's locals (the whole poll batch) until the cyclic collector runs.
    runtime, _, producer = _fake_runtime(set())

    def handler(record: Record) -> None:
        raise RuntimeError(f"always {record.offset}")

    runtime.handler = handler
    retry = h.replace([], {h.ATTEMPT: 1, h.DUE: 1, h.GROUP: "g", h.FIRST_FAILURE: 1,
                           **h.origin_fields(Origin("orders", 0, 99, 1))})
    copies = [FakeMessage("orders.g.retry.1s", 1, 7, b"r", retry)]
    runtime._assigned.add(("orders.g.retry.1s", 1))
    gc.collect()
    gc.disable()
    try:
        runtime._handle_batch(_batch(0, range(0, 4)) + copies)  # ends on a failed record
        producer.deliver()
        runtime._require_committer().settle()
        left = gc.collect()
    finally:
        gc.enable()
    assert runtime.metrics.total("redrive_retried_total") == 5
    assert left == 0


def test_a_producer_whose_idempotence_state_the_broker_lost_is_replaced() -> None:
    # After a broker restart a copy is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (the report's
    # error is not flagged fatal, the producer is): every later copy would fail the same way.
    runtime, consumer, producer = _fake_runtime({b"0-1"})
    fresh = FakeProducer()
    committer = runtime._require_committer()
    committer._make_producer = lambda: fresh  # type: ignore[assignment, return-value]
    producer.fail_values = {b"0-1"}
    producer.failure = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence gap")
    runtime._handle_batch(_batch(0, range(0, 5)))
    producer.deliver()
    committer.settle()
    assert producer.purged and committer._producer is fresh
    assert consumer.seeks == [("orders", 0, 1)] and consumer.commits == [{A: 1}]
    runtime._handle_batch(_batch(0, range(1, 5)))  # handled again, its copy by the new one
    fresh.deliver()
    committer.settle()
    assert consumer.commits == [{A: 1}, {A: 5}]


def _fatal_in_a_callback() -> SystemError:
    try:
        raise KafkaException(KafkaError(KafkaError._FATAL, "fatal idempotence error", fatal=True))
    except KafkaException as fatal:
        try:
            raise SystemError("callback raised") from fatal
        except SystemError as raised:
            return raised


@pytest.mark.parametrize("raised", [
    _fatal_in_a_callback(),  # librdkafka's fatal error, as raised from inside a callback
    SystemError("<method 'poll' of 'cimpl.Producer' objects> returned NULL without setting an "
                "exception"),  # the same failure, once, with no cause at all
], ids=["caused", "no-cause"])
def test_a_producer_that_failed_for_good_in_poll_is_replaced(raised: SystemError) -> None:
    # Seen after noida-db restarts: the oldest batch fails, is rewound, and a new producer takes
    # over; any other SystemError is not swallowed.
    runtime, consumer, producer = _fake_runtime({b"0-1"})
    fresh = FakeProducer()
    committer = runtime._require_committer()
    committer._make_producer = lambda: fresh  # type: ignore[assignment, return-value]

    def poll(timeout: float = 0) -> int:
        raise raised

    producer.poll = poll  # type: ignore[method-assign]
    runtime._handle_batch(_batch(0, range(0, 5)))
    assert producer.purged and committer._producer is fresh
    assert consumer.seeks == [("orders", 0, 1)] and consumer.commits == [{A: 1}]

    def broken(timeout: float = 0) -> int:
        raise SystemError("not a Kafka error")

    fresh.poll = broken  # type: ignore[method-assign]
    with pytest.raises(SystemError, match="not a Kafka error"):
        runtime._handle_batch(_batch(0, range(0, 5)))


def test_a_partition_that_cannot_be_sought_while_leaving_does_not_stop_the_close() -> None:
    runtime, consumer, producer = _fake_runtime({b"0-1"})
    producer.fail_values = {b"0-1"}
    runtime._handle_batch(_batch(0, range(0, 5)))
    consumer.seek_error = KafkaError(KafkaError._STATE, "Erroneous state")
    runtime.close()  # the failed batch cannot be rewound: only record 0 of it is committed
    assert consumer.commits == [{A: 1}, {A: 1}] and consumer.synced == []  # once more on close


class FakeTransactions:
    """A transactional producer whose commits abort with the queued errors, then succeed."""

    def __init__(self, errors: list[KafkaError]) -> None:
        self.errors = errors
        self.committed: list[dict[tuple[str, int], int]] = []

    def commit(self, records: Iterable[Any], offsets: list[Any], group_metadata: Any,
               **kwargs: Any) -> None:
        list(records)
        if self.errors:
            cause = KafkaException(self.errors.pop(0))
            raise TransactionAborted(f"aborted: {cause.args[0]}") from cause
        self.committed.append({(p.topic, p.partition): p.offset for p in offsets})


@pytest.mark.parametrize("error, held", [
    (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "ProduceRequest failed"), True),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed"), True),
    # Seen in CI after refused copies' aborts, from sending the offsets. Held as a refusal, the
    # partition's next pause doubled past the test's wait.
    (KafkaError(KafkaError._STATE, "Failed to commit offsets to transaction on broker (none): "
                "Local: Erroneous state"), False),
    (KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "coordinator moving", retriable=True),
     False),
    (KafkaError(KafkaError._TIMED_OUT, "no answer"), False),
    # Not foreseen as passing: held, rather than handled again as fast as the loop runs.
    (KafkaError(KafkaError._UNKNOWN_TOPIC, "the copy's topic is gone"), True),
], ids=["too-large", "not-allowed", "erroneous-state", "retriable", "unanswered", "unforeseen"])
def test_an_aborted_transaction_holds_its_partition_only_when_the_broker_refused_a_copy(
        error: KafkaError, held: bool) -> None:
    runtime, consumer, _ = _fake_runtime({b"0-1"}, holds=True)
    transactions = FakeTransactions([error])
    consumer.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    committer = Committer("g", runtime._require_consumer(), runtime._backend, runtime.metrics,
                          runtime._assigned, 30.0, runtime.health,
                          transactions=transactions,  # type: ignore[arg-type]
                          holds=runtime._holds)
    runtime._committer = committer
    runtime._handle_batch(_batch(0, range(0, 3)) + _batch(1, range(0, 3)))
    assert transactions.committed == []
    # B's records made no copy: it is read again at once, whatever the abort's cause.
    assert sorted(consumer.seeks) == [("orders", 0, 0), ("orders", 1, 0)]
    assert B not in runtime._holds
    assert (A in runtime._holds) is held
    runtime._holds.release(runtime._require_consumer(), [A])
    runtime._handle_batch(_batch(0, range(0, 3)) + _batch(1, range(0, 3)))
    assert transactions.committed == [{A: 3, B: 3}]
