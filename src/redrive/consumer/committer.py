"""The consumer runtime's commit side: a handled batch's copies produced, its offsets committed.

At-least-once, the copies go out without waiting and the batch waits in a `CommitPipeline` while
the next batches are handled: its offsets (offset + 1 of the last finished record per partition)
are committed once its copies and those of every earlier batch are acknowledged, and a failed
delivery rewinds the partitions of the first unconfirmed batch and of every later one to their
first records, uncommitted (at-least-once). A batch with no copies, while nothing is unconfirmed,
is committed at once. Those commits do not wait for the broker's answer (a synchronous commit
blocks for as long as the group's coordinator is away); on revoke and close what was so committed
is committed once more, waiting. Transactional, the copies and offsets of a batch are one Kafka
transaction (`redrive.kafka.transactions`); an aborted one rewinds the batch's partitions.
Either way the retry backend's `flush` comes first, so a committed offset always has its outcome
recorded.

A copy the broker refused, rather than left unanswered (larger than its topic takes, a topic the
group may not write), would be refused again as soon as its records are handled again, calling
the handler as fast as the loop runs: a partition whose copy was refused is held instead, from
that copy's record, the records before it committed (`redrive.kafka.holds.Refusals`), and the
other rewound partitions are read again at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from redrive import kafka
from redrive.backends import BoundBackend
from redrive.clock import now_ms
from redrive.consumer.batch import Batch, Copy
from redrive.consumer.commits import CommitPipeline, Pending, topic_of
from redrive.consumer.readers import Readers
from redrive.errors import DeliveryFailed, RedriveError
from redrive.kafka.causes import drop_stack
from redrive.kafka.health import BrokerHealth
from redrive.kafka.holds import Holds, Refusals
from redrive.kafka.produce import discard_producer, flush_closing, passing_failure, producer_failed
from redrive.kafka.records import PartitionKey
from redrive.kafka.transactions import TransactionAborted, TransactionalProducer
from redrive.metrics import Metrics
from redrive.oversize import slimmed
from redrive.routing import DeadLetter, Retry

log = logging.getLogger("redrive.consumer")

# Batches whose copies may be unconfirmed at once before the runtime waits for the oldest.
MAX_UNCONFIRMED_BATCHES = 8
# How long one wait for the member's callbacks lasts while closing.
AWAIT_COMMITS_POLL_S = 0.1


def default_transactional_id(group: str, config: Mapping[str, Any] | None) -> str:
    """redrive-GROUP-INSTANCE with a group.instance.id (a restarted instance fences its
    predecessor), else with a random suffix."""
    instance = (config or {}).get("group.instance.id")
    suffix = str(instance) if instance else uuid.uuid4().hex[:12]
    return f"redrive-{group}-{suffix}"


class Committer:
    """Commits one runtime's batches, from its thread. `assigned` is the runtime's set of
    assigned partitions (read here: a rewind leaves partitions no longer ours alone)."""

    def __init__(self, group: str, consumer: Readers, backend: BoundBackend, metrics: Metrics,
                 assigned: set[PartitionKey], timeout_s: float, health: BrokerHealth, *,
                 producer: Producer | None = None,
                 make_producer: Callable[[], Producer] | None = None,
                 transactions: TransactionalProducer | None = None,
                 holds: Holds | None = None, stopping: threading.Event | None = None) -> None:
        self.group = group
        self._consumer = consumer
        self._backend = backend
        self.metrics = metrics
        self._assigned = assigned
        self._timeout_s = timeout_s
        self._health = health
        self._producer = producer
        self._make_producer = make_producer
        self._transactions = transactions
        self._pipeline = CommitPipeline()
        # Offsets committed asynchronously since the last synchronous commit.
        self._unsynced: dict[PartitionKey, int] = {}
        # Asynchronous commits not answered yet (on_commit is not called for synchronous ones).
        self._in_flight = 0
        self._holds = holds
        self._refusals = Refusals()
        self._stopping = stopping or threading.Event()

    @property
    def unconfirmed(self) -> bool:
        """Whether copies produced are still waiting for the broker's acknowledgement."""
        return bool(self._pipeline)

    def close(self, deadline: float) -> None:
        """Release the producers, waiting until the monotonic `deadline` at most for what they
        hold: copies of batches already rewound, whose offsets were not committed."""
        if self._producer is not None:
            # One that failed for good held copies of batches not committed: nothing is lost.
            flush_closing(self._producer, _left(deadline), f"group {self.group}")
        if self._transactions is not None:
            self._transactions.close()

    def complete(self, batch: Batch) -> None:
        """Produce the batch's copies and commit its offsets (see the module for how)."""
        offsets = batch.commit_offsets()
        if not offsets:
            return
        try:
            self._backend.flush()
        except RedriveError as exc:
            log.error("group %s: %s; the batch's partitions are rewound and its records will be "
                      "handled again", self.group, exc)
            self._rewind(batch.first)
            return
        if self._transactions is not None:
            if self._commit_transaction(batch, offsets):
                self._count_routed(batch.copies)
            return
        out = batch.out_records
        if not out and not self._pipeline:
            self._commit(offsets)
            self._count_routed(batch.copies)
            return
        # The copies go out now and are confirmed while the next batches are handled; the
        # offsets are committed, in batch order, once every copy up to this batch is acknowledged.
        pending = Pending(offsets, batch.first, batch.copies, time.monotonic())
        producer = self._copies_producer()
        for index, copy in enumerate(batch.copies):
            record = copy.record
            if record is None:
                continue
            try:
                kafka.produce(producer, record, pending.reporter(index), shrink=slimmed,
                              wait_s=self._timeout_s)
            except KafkaException as exc:
                if not producer_failed(exc):
                    raise
                pending.fail(DeliveryFailed(record.topic, record.partition, str(exc.args[0]),
                                            fatal=True))
                break
            except DeliveryFailed as exc:  # no room in the queue: no broker takes records
                pending.fail(exc, index)
                break
            pending.sent()
        self._pipeline.add(pending)
        self.settle()
        if len(self._pipeline) > MAX_UNCONFIRMED_BATCHES:
            self._wait_for_head()

    def settle(self, exclude: Iterable[PartitionKey] = (), *,
               leaving: Collection[PartitionKey] = ()) -> None:
        """Serve delivery reports; commit the acknowledged batches in order; rewind on a failure.
        `leaving`: the partitions being revoked or closed, rewound even for a refused copy (a
        hold would outlive them) and left as they are where they cannot be sought."""
        if not self._pipeline:
            return
        self._serve(0)
        self._pipeline.expire(time.monotonic(), self._timeout_s)
        settled = self._pipeline.settle(exclude)
        if settled.commit:
            self._commit(settled.commit)
        self._count_routed(settled.confirmed)
        if settled.error is not None:
            if settled.error.unanswered:
                self._health.trouble(str(settled.error))
            log.error("group %s: %s; the unconfirmed batches' partitions are rewound to their "
                      "first records not confirmed, which will be handled again", self.group,
                      settled.error)
            if settled.error.fatal:
                self._renew_producer()
            excluded = set(exclude)
            rewind = {tp: offset for tp, offset in settled.rewind.items()
                      if tp in self._assigned and tp not in excluded}
            if settled.error.unanswered or settled.error.fatal:
                self._rewind(rewind, leaving=leaving)
                return
            # A cooperative revoke leaves the others ours: they go on as after any refusal.
            self._rewind({tp: offset for tp, offset in rewind.items() if tp in leaving},
                         leaving=leaving)
            kept = {tp: offset for tp, offset in rewind.items() if tp not in leaving}
            if kept:
                self._hold_refused(kept, settled.culprits)

    def _wait_for_head(self) -> None:
        """Too many batches unconfirmed: wait for the oldest (the broker is slower than us), or
        until a stop, whose close waits for them as long as it may (an outage would otherwise
        keep a SIGTERM waiting for timeout_s, then the close's own wait)."""
        while len(self._pipeline) > MAX_UNCONFIRMED_BATCHES and not self._stopping.is_set():
            head = self._pipeline.head
            if head is not None and head.waiting > 0 and head.error is None:
                self._serve(0.005)
            self.settle()

    def settle_all(self, exclude: Iterable[PartitionKey] = (), *,
                   leaving: Collection[PartitionKey] | None = None,
                   deadline: float | None = None) -> None:
        """Wait for every copy produced so far, commit what was acknowledged, and commit once
        more what was committed asynchronously since the last time (on revoke and close: the
        next owner starts from there).

        On revoke (no deadline) that last commit is synchronous: a rebalance callback cannot
        serve the member's callbacks. On close it is asynchronous, and the member's callbacks
        are served until every commit in flight is answered or the monotonic `deadline`
        passes: a synchronous commit, like the close after it, waits for as long as the
        group's coordinator does not answer (see `redrive.kafka.closing`)."""
        if self._pipeline:
            wait_s = self._timeout_s if deadline is None else _left(deadline)
            if self._serve(wait_s, flush=True) > 0:
                self._pipeline.expire_all(self._timeout_s)
            left = set(self._assigned) if leaving is None else set(leaving)
            while self._pipeline:
                self.settle(exclude, leaving=left)
        skip = set(exclude)
        owed = {tp: offset for tp, offset in self._unsynced.items()
                if tp in self._assigned and tp not in skip}
        self._unsynced.clear()
        if deadline is not None:
            if owed:
                self._commit(owed)
                # _commit keeps them owed, and the consumer's close runs the revoke callback,
                # whose settle_all would commit them again synchronously: the wait this avoids.
                self._unsynced.clear()
            self._await_commits(deadline)
        # During an outage the asynchronous commits are all there is (at-least-once: the next
        # owner may repeat some).
        elif owed and not self._health.down:
            self._commit_now(owed)

    def _await_commits(self, deadline: float) -> None:
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._consumer.serve_commits(min(_left(deadline), AWAIT_COMMITS_POLL_S))
        if self._in_flight > 0:
            log.warning("group %s: %d commits were not answered in time; the records they "
                        "cover will be handled again by the partitions' next owner",
                        self.group, self._in_flight)

    def _commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        """Commit without waiting: a synchronous commit blocks the loop, and stop(), for as long
        as the group's coordinator cannot be reached. `committed` gets the outcome."""
        self._unsynced.update(offsets)
        self._refusals.forget(offsets)
        try:
            self._consumer.commit(offsets=_partitions(offsets), asynchronous=True)
            self._in_flight += 1
        except KafkaException as exc:
            # The records are finished but not committed: whoever owns the partitions next
            # handles them again (at-least-once), which is all that can be done here.
            if not self._health.failed(exc):
                log.warning("group %s: commit of %s failed: %s", self.group, offsets, exc)

    def committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The outcome of an asynchronous commit (the member's on_commit callback)."""
        self._in_flight = max(self._in_flight - 1, 0)
        self._outcome(error, partitions)

    def _outcome(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if error is not None:
            if not self._health.failed(KafkaException(error)):
                log.warning("group %s: a commit failed: %s", self.group, error.str())
            return
        self._health.ok()
        for result in partitions:
            if result.error is not None:
                log.warning("group %s: commit of %s[%d] failed: %s", self.group, result.topic,
                            result.partition, result.error)

    def _commit_now(self, offsets: Mapping[PartitionKey, int]) -> None:
        try:
            results = self._consumer.commit(offsets=_partitions(offsets), asynchronous=False)
        except KafkaException as exc:
            if not self._health.failed(exc):
                log.warning("group %s: commit of %s failed: %s", self.group, offsets, exc)
            return
        self._outcome(None, results)  # not one of those in flight: close still waits for them

    def _commit_transaction(self, batch: Batch, offsets: Mapping[PartitionKey, int]) -> bool:
        """The batch's copies and offsets in one transaction; False if it was aborted and its
        partitions rewound (a ProducerFenced, from a newer instance with this transactional
        id, ends run())."""
        assert self._transactions is not None
        try:
            self._transactions.commit(batch.out_records, _partitions(offsets),
                                      self._consumer.consumer_group_metadata(), shrink=slimmed)
            self._health.ok()
            self._refusals.forget(offsets)
            return True
        except TransactionAborted as exc:
            unanswered = self._health.failed(exc)
            log.error("group %s: %s; the batch's partitions are rewound", self.group, exc)
            if unanswered or exc.__cause__ is None or producer_failed(exc) \
                    or passing_failure(exc):
                self._rewind(batch.first)
            else:
                self._hold_refused(batch.first, batch.copied)
            return False

    def _hold_refused(self, first: Mapping[PartitionKey, int],
                      culprits: Collection[PartitionKey]) -> None:
        """Rewind after a refused copy, each partition whose copy was refused held for its next
        pause (see the module), the others read again at once: held alike, partitions would come
        back together, and be refused together, for ever."""
        if self._holds is None:
            self._rewind(first)
            return
        self._rewind({tp: offset for tp, offset in first.items() if tp not in culprits})
        at = now_ms()
        for tp, offset in first.items():
            if tp in culprits:
                pause_s = self._refusals.hold(self._holds, self._consumer, tp, offset, at)
                log.warning("group %s: %s[%d] is read again from offset %d in %g s",
                            self.group, tp[0], tp[1], offset, pause_s)
        self.metrics.paused_partitions(len(self._holds))

    def _rewind(self, first: Mapping[PartitionKey, int], *,
                leaving: Collection[PartitionKey] = ()) -> None:
        """Seek back to the first records of failed batches. A partition being left (revoke,
        close) that cannot be sought (librdkafka's erroneous state, as after a broker restart)
        is left as it is: nothing past the rewind is committed, so its next owner starts there.
        Otherwise the error ends run(): reading on from there would skip those records."""
        consumer = self._consumer
        for (topic, partition), offset in first.items():
            try:
                consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                if (topic, partition) not in leaving:
                    raise
                log.warning("group %s: %s[%d] not rewound to %d while leaving it (%s); its "
                            "next owner starts from the committed offset", self.group, topic,
                            partition, offset, exc.args[0])

    def _count_routed(self, copies: Iterable[Copy]) -> None:
        # Counted per label set: a metric's increment costs about a microsecond, a batch's
        # copies share a few label sets.
        retried: Counter[tuple[str, int]] = Counter()
        dead: Counter[tuple[str, str]] = Counter()
        for copy in copies:
            decision = copy.decision
            if isinstance(decision, Retry):
                retried[copy.main_topic, decision.attempt] += 1
            else:
                assert isinstance(decision, DeadLetter)
                dead[copy.main_topic, decision.reason] += 1
        for (topic, attempt), count in retried.items():
            self.metrics.retried(topic, attempt, count)
        for (topic, reason), count in dead.items():
            self.metrics.dead_lettered(topic, reason, count)


    def _serve(self, timeout_s: float, *, flush: bool = False) -> int:
        """Serve the copies' delivery reports (poll, or flush: wait for all); return how many
        copies are still unconfirmed. librdkafka raises a fatal producer error from here: it
        fails the oldest unconfirmed batch, so that settle() rewinds every batch the producer
        held and replaces it."""
        producer = self._copies_producer()
        try:
            if flush:
                return int(producer.flush(timeout_s))
            producer.poll(timeout_s)
            return 0
        except (KafkaException, SystemError) as exc:
            # Inside a rebalance callback confluent-kafka surfaces the fatal error as a
            # SystemError caused by it (seen after a noida-db restart); producer_failed looks
            # through the causes.
            if not producer_failed(exc):
                raise
            if isinstance(exc, SystemError):
                drop_stack(exc)
            head = self._pipeline.head
            if head is not None:
                head.fail(DeliveryFailed(topic_of(head.copies), None,
                                         "the producer of copies failed for good", fatal=True))
            else:
                self._renew_producer()
            return 0

    def _renew_producer(self) -> None:
        """The producer of copies failed fatally (its idempotence state lost, as after a broker
        restart): every batch it held is rewound already, so a new one takes over."""
        discard_producer(self._producer)
        self._producer = None
        if self._make_producer is not None:
            self._producer = self._make_producer()
        log.warning("group %s: a new producer of copies replaces the one that failed",
                    self.group)

    def _copies_producer(self) -> Producer:
        if self._producer is None:
            raise RedriveError(f"consumer of group {self.group!r} has no producer for copies")
        return self._producer


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def _partitions(offsets: Mapping[PartitionKey, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, partition, offset)
            for (topic, partition), offset in offsets.items()]
