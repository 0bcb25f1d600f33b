"""The consumer runtime's commit side: a handled batch's copies produced, its offsets committed.

At-least-once, the copies go out without waiting and the batch waits in a `CommitPipeline` while
the next batches are handled: its offsets are committed once its copies and those of every earlier
batch are acknowledged, and a failed delivery rewinds the partitions of the first unconfirmed
batch and of every later one. Transactional, the copies and offsets of a batch are one Kafka
transaction (`redrive.kafka.transactions`); an aborted one rewinds the batch's partitions.
Either way the retry backend's `flush` comes first, so a committed offset always has its outcome
recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException, Producer, TopicPartition

from redrive import kafka
from redrive.backends import BoundBackend
from redrive.consumer.batch import Batch, Copy
from redrive.consumer.commits import CommitPipeline, Pending
from redrive.consumer.readers import Readers
from redrive.errors import RedriveError
from redrive.kafka.records import PartitionKey
from redrive.kafka.transactions import TransactionAborted, TransactionalProducer
from redrive.metrics import Metrics
from redrive.routing import DeadLetter, Retry

log = logging.getLogger("redrive.consumer")

# Batches whose copies may be unconfirmed at once before the runtime waits for the oldest.
MAX_UNCONFIRMED_BATCHES = 8


class Committer:
    """Commits one runtime's batches, from its thread. `assigned` is the runtime's set of
    assigned partitions (read here: a rewind leaves partitions no longer ours alone)."""

    def __init__(self, group: str, consumer: Readers, backend: BoundBackend, metrics: Metrics,
                 assigned: set[PartitionKey], timeout_s: float, *,
                 producer: Producer | None = None,
                 transactions: TransactionalProducer | None = None) -> None:
        self.group = group
        self._consumer = consumer
        self._backend = backend
        self.metrics = metrics
        self._assigned = assigned
        self._timeout_s = timeout_s
        self._producer = producer
        self._transactions = transactions
        self._pipeline = CommitPipeline()

    @property
    def unconfirmed(self) -> bool:
        """Whether copies produced are still waiting for the broker's acknowledgement."""
        return bool(self._pipeline)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self._timeout_s)
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
            if not self._commit_transaction(batch, offsets):
                self._rewind(batch.first)
                return
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
        for record in out:
            kafka.produce(producer, record, pending.on_delivery)
            pending.sent()
        self._pipeline.add(pending)
        self.settle()
        if len(self._pipeline) > MAX_UNCONFIRMED_BATCHES:
            self._wait_for_head()

    def settle(self, exclude: Iterable[PartitionKey] = ()) -> None:
        """Serve delivery reports; commit the acknowledged batches in order; rewind on a failure."""
        if not self._pipeline:
            return
        self._copies_producer().poll(0)
        self._pipeline.expire(time.monotonic(), self._timeout_s)
        settled = self._pipeline.settle(exclude)
        if settled.commit:
            self._commit(settled.commit)
        self._count_routed(settled.confirmed)
        if settled.error is not None:
            log.error("group %s: %s; the unconfirmed batches' partitions are rewound and their "
                      "records will be handled again", self.group, settled.error)
            excluded = set(exclude)
            self._rewind({tp: offset for tp, offset in settled.rewind.items()
                          if tp in self._assigned and tp not in excluded})

    def _wait_for_head(self) -> None:
        """Too many batches unconfirmed: wait for the oldest (the broker is slower than us)."""
        producer = self._copies_producer()
        while len(self._pipeline) > MAX_UNCONFIRMED_BATCHES:
            head = self._pipeline.head
            if head is not None and head.waiting > 0 and head.error is None:
                producer.poll(0.005)
            self.settle()

    def settle_all(self, exclude: Iterable[PartitionKey] = ()) -> None:
        """Wait for every copy produced so far, then commit what was acknowledged."""
        if not self._pipeline:
            return
        remaining = self._copies_producer().flush(self._timeout_s)
        if remaining > 0:
            self._pipeline.expire_all(self._timeout_s)
        while self._pipeline:
            self.settle(exclude)

    def _commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        partitions = [TopicPartition(topic, partition, offset)
                      for (topic, partition), offset in offsets.items()]
        try:
            results = self._consumer.commit(offsets=partitions, asynchronous=False)
        except KafkaException as exc:
            # The records are finished but not committed: whoever owns the partitions next
            # handles them again (at-least-once), which is all that can be done here.
            log.warning("group %s: commit of %s failed: %s", self.group, offsets, exc)
            return
        for result in results:
            if result.error is not None:
                log.warning("group %s: commit of %s[%d] failed: %s", self.group, result.topic,
                            result.partition, result.error)

    def _commit_transaction(self, batch: Batch, offsets: Mapping[PartitionKey, int]) -> bool:
        """The batch's copies and offsets in one transaction; False if it was aborted (a
        ProducerFenced, from a newer instance with this transactional id, ends run())."""
        assert self._transactions is not None
        partitions = [TopicPartition(topic, partition, offset)
                      for (topic, partition), offset in offsets.items()]
        try:
            self._transactions.commit(batch.out_records, partitions,
                                      self._consumer.consumer_group_metadata())
            return True
        except TransactionAborted as exc:
            log.error("group %s: %s; the batch's partitions are rewound", self.group, exc)
            return False

    def _rewind(self, first: Mapping[PartitionKey, int]) -> None:
        consumer = self._consumer
        for (topic, partition), offset in first.items():
            consumer.seek(TopicPartition(topic, partition, offset))

    def _count_routed(self, copies: Iterable[Copy]) -> None:
        for copy in copies:
            decision = copy.decision
            if isinstance(decision, Retry):
                self.metrics.retried(copy.main_topic, decision.attempt)
            else:
                assert isinstance(decision, DeadLetter)
                self.metrics.dead_lettered(copy.main_topic, decision.reason)


    def _copies_producer(self) -> Producer:
        if self._producer is None:
            raise RedriveError(f"consumer of group {self.group!r} has no producer for copies")
        return self._producer
