"""The delay service: reads the tier topics, waits until records are due, forwards them.

Each poll admits, per partition, the records whose hop has ended (the due gate), and forwards them
to their next tier or, once their final due time has come, to their `redrive-target`. The first
record not yet due stops its partition: the service pauses the partition, seeks back to that record
and keeps polling the others, resuming it when that record is due. It holds nothing but that
per-partition state, however many records are pending.

Every copy keeps the record's key, value and headers and is stamped with the instant it was
forwarded: the next hop counts its wait from that timestamp, and retention and time indexes of the
tier and target topics see a current time, not the day the record was scheduled.

A service started with other tiers than before (the same prefix) reads the tiers it dropped too,
while they hold records past its group's offsets: otherwise nothing would forward them again.

Forwarding is one Kafka transaction per poll: the forwarded copies and the consumed offsets commit
together, so a crash at any point neither loses nor duplicates a record for read_committed readers.
Without transactions (at-least-once) the copies are confirmed by the broker before the offsets are
committed, so a crash may forward a record twice but never drops it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from redrive import gate, kafka, retention
from redrive import headers as h
from redrive.arguments import (
    check_instance,
    check_int,
    check_positive,
    check_settings,
    check_text,
)
from redrive.clock import now_ms
from redrive.delay.batch import Batch
from redrive.delay.own_topics import DEFAULT_PARTITIONS, FormerTiers, check_topics, ensure_topics
from redrive.delay.schedule import check_target
from redrive.delay.settling import Landed, settle
from redrive.delay.tiers import DEFAULT_TIERS, Tier, Tiers, hop_due
from redrive.errors import (
    DelayServiceError,
    DeliveryFailed,
    InvalidArgument,
    MalformedHeader,
    RecordTooLarge,
    RedriveError,
)
from redrive.former_looks import FormerLooks
from redrive.gc_pause import gc_paused
from redrive.kafka.closing import close_within
from redrive.kafka.health import UNREACHED_CODES, BrokerHealth
from redrive.kafka.holds import Hold, Holds, Refusals, Why
from redrive.kafka.produce import discard_producer, flush_closing, passing_failure, producer_failed
from redrive.kafka.transactions import ProducerFenced, TransactionAborted, TransactionalProducer
from redrive.metrics import Metrics
from redrive.record import qualified_name
from redrive.signals import stop_on_signals

log = logging.getLogger(__name__)

DEFAULT_GROUP = "redrive-delay"
MAX_BATCH = 5000
# How long one poll may block when no partition is due sooner: bounds the reaction to stop().
IDLE_POLL_S = 0.2
# How long closing waits for the consumer, then for the forwarded copies not yet acknowledged.
CLOSE_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 30.0

CONSUMER_SETTINGS: Mapping[str, Any] = {
    # The fetch queue is the only buffer of pending records; bounding it keeps memory flat
    # however deep the tiers are.
    "queued.min.messages": 2000,
    "queued.max.messages.kbytes": 8192,
    # A record that lands on an idle partition waits at most this long to be fetched, even from
    # a broker that holds a long poll to its end; it is part of the service's lateness.
    "fetch.wait.max.ms": 50,
    # When the local queue is over those limits, librdkafka postpones the partition's next fetch
    # by this much (1 s by default), which would add straight to the records' lateness.
    "fetch.queue.backoff.ms": 20,
    # Eager assignment: every member's transaction is committed before partitions move.
    "partition.assignment.strategy": "range",
}
PRODUCER_SETTINGS: Mapping[str, Any] = {
    # The partitioner of the Java client, so keyed records land where the application's own
    # producers put that key.
    "partitioner": "murmur2_random",
}

Key = tuple[str, int]


class _Malformed(Exception):
    def __init__(self, error: RedriveError) -> None:
        super().__init__(str(error))
        self.error = error


class DelayService:
    """Forward delayed records when they are due; `run()` until `stop()` or SIGTERM.

    connection: a bootstrap address or a librdkafka config mapping (security settings etc.).
    instance_id: a stable name per instance (a pod name): used as `group.instance.id` and in the
        transactional id, so that a restarted instance gets its partitions back at once and
        aborts what its crashed predecessor left open. Without it each run gets a random one.
    transactional: False forwards at-least-once (no transactions; a crash may duplicate).
    timeout_s: how long a transaction's calls wait for the brokers. A stop while they do not
        answer returns after about this long, plus CLOSE_TIMEOUT_S for the consumer's close.
    """

    def __init__(self, connection: kafka.Connection, tiers: Tiers = DEFAULT_TIERS, *,
                 transactional: bool = True, instance_id: str | None = None,
                 metrics_port: int | None = None, group_id: str = DEFAULT_GROUP,
                 partitions: int = DEFAULT_PARTITIONS, create_topics: bool = True,
                 max_batch: int = MAX_BATCH,
                 consumer_overrides: Mapping[str, Any] | None = None,
                 producer_overrides: Mapping[str, Any] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        check_positive("timeout_s", timeout_s)
        check_int("partitions", partitions, 1, 1_000_000)
        check_int("max_batch", max_batch, 1, 1_000_000)
        check_text("instance_id", instance_id)
        if not isinstance(group_id, str) or not group_id:
            # librdkafka aborts the whole process on an empty group id.
            raise InvalidArgument("group_id", group_id, "must be a non-empty group name")
        check_instance("tiers", tiers, Tiers, "a Tiers (Tiers.parse('1s,1m,1h'))")
        check_instance("transactional", transactional, bool, "True or False")
        check_instance("create_topics", create_topics, bool, "True or False")
        consumer_settings = check_settings("consumer_overrides", consumer_overrides)
        producer_settings = check_settings("producer_overrides", producer_overrides)
        reset = consumer_settings.get("auto.offset.reset", "earliest")
        if str(reset).lower() not in ("earliest", "smallest", "beginning"):
            raise InvalidArgument("consumer_overrides", consumer_settings,
                                  f"auto.offset.reset={reset!r}: the tiers hold only records "
                                  "waiting for their due time, which a new service group must "
                                  "not skip; it reads them from the earliest offset")
        self.connection = connection
        self.tiers = tiers
        self.transactional = transactional
        self.instance_id = instance_id
        self.group_id = group_id
        self.partitions = partitions
        self.create_topics = create_topics
        self.max_batch = max_batch
        self.metrics = Metrics("delay", group_id)
        self.health = BrokerHealth(f"delay service {group_id}", self.metrics,
                                   topic=tiers.tiers[0].topic)
        self._watched = self.health.watch(kafka.client_config(connection))
        self._metrics_port = metrics_port
        self._consumer_overrides = consumer_settings
        self._producer_overrides = producer_settings
        self._timeout_s = float(timeout_s)
        self._stopping = threading.Event()
        self._tiers: dict[Key, Tier] = {}  # the assigned partitions and their tiers
        self._former = FormerTiers(self._watched, tiers, group_id)
        self._former_looks = FormerLooks(self._watched, f"delay service {group_id}")
        self._holds = Holds()
        self._refusals = Refusals()
        self._landed = Landed()  # at-least-once, past a refused record
        self._known_topics: set[str] = set()
        self._targets: dict[bytes, str] = {}
        self._refreshed = False
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None  # at-least-once
        self._transactions: TransactionalProducer | None = None

    @property
    def assignment(self) -> frozenset[Key]:
        """The tier partitions this instance forwards now, as (topic, partition) pairs."""
        return frozenset(self._tiers)

    # --- life cycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run()` to finish forwarding the current poll and return (thread-, signal-safe)."""
        self._stopping.set()

    def run(self) -> None:
        """Forward until stop() (or SIGTERM/SIGINT when run from the main thread)."""
        with stop_on_signals(self.stop):
            try:
                self._start()
                while not self._stopping.is_set():
                    # The service runs no user code: a poll's batch is its own work, which the
                    # collector's passes made a sixth dearer (10.1 against 8.7 µs of CPU a record
                    # forwarded at-least-once, medians of three, alternating).
                    with gc_paused():
                        self._step()
                    self._former_looks.again(self._read_former)
            finally:
                self._close()

    def _start(self) -> None:
        if self.create_topics:
            ensure_topics(self._watched, self.tiers, self.partitions)
        admin = kafka.admin(self._watched)
        existing = kafka.topic_partitions(admin)
        if not self.create_topics:
            check_topics(self.tiers, existing)
        retention.check(admin, self.tiers.waits)
        self._former.look(existing)
        if self._metrics_port is not None:
            self.metrics.serve(self._metrics_port)
        consumer_settings = {**CONSUMER_SETTINGS, "on_commit": self._committed}
        if self.instance_id is not None:
            consumer_settings["group.instance.id"] = self.instance_id
        self._consumer = kafka.consumer(self._watched, self.group_id,
                                        {**consumer_settings, **self._consumer_overrides})
        overrides = {**PRODUCER_SETTINGS, **self._producer_overrides}
        if self.transactional:
            suffix = self.instance_id or uuid.uuid4().hex
            self._transactions = TransactionalProducer(
                self._watched, f"{self.group_id}.{suffix}", overrides=overrides,
                timeout_s=self._timeout_s, stopping=self._stopping)
            # Fences any older producer with this id and aborts what it left open.
            self._transactions.start()
        else:
            self._producer = self._new_producer()
        self._subscribe()

    def _read_former(self, partitions: Mapping[str, int]) -> None:
        if self._former.look(partitions):
            self._subscribe()

    def _subscribe(self) -> None:
        self._require_consumer().subscribe(
            [*self.tiers.topics, *self._former.found], on_assign=self._on_assign,
            on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def _new_producer(self) -> Producer:
        return kafka.producer(self._watched,
                              overrides={**PRODUCER_SETTINGS, **self._producer_overrides})

    def _close(self) -> None:
        if self._consumer is not None:
            # Bounded, as a stop must be, while the brokers do not answer its commits.
            close_within(self._consumer.close, time.monotonic() + CLOSE_TIMEOUT_S,
                         f"delay service {self.group_id}")
            self._consumer = None
        if self._producer is not None:
            flush_closing(self._producer, CLOSE_TIMEOUT_S, f"delay service {self.group_id}")
            self._producer = None
        if self._transactions is not None:
            self._transactions.close()
            self._transactions = None
        self._tiers.clear()
        self._former_looks.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        for tp in partitions:
            self._tiers[(tp.topic, tp.partition)] = (self._former.found.get(tp.topic)
                                                     or self.tiers.by_topic(tp.topic))
        retention.report_gone(consumer, [(tp.topic, tp.partition) for tp in partitions],
                              self.metrics, f"delay service {self.group_id}")
        self.metrics.rebalanced("assign")
        log.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))
        self._report_paused()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        # A partition this instance held starts afresh from its committed offset wherever it
        # goes next, this instance included: its hold and pause end here.
        self._holds.release(consumer, keys)
        self._landed.drop(keys)
        for key in keys:
            self._tiers.pop(key, None)
        self.metrics.rebalanced("revoke")
        self._report_paused()

    def _report_paused(self) -> None:
        self.metrics.paused_partitions(len(self._holds))
        self.metrics.oldest_pending_retry_since(self._holds.oldest_since_ms())

    # --- one poll ---------------------------------------------------------------------------

    def _step(self) -> None:
        consumer = self._require_consumer()
        if self._holds.release_due(consumer, now_ms()):
            self._report_paused()
        first = consumer.poll(self._holds.wait_s(now_ms(), IDLE_POLL_S))
        if first is None:
            self._report_paused()  # the oldest held record's age grows while nothing arrives
            self.health.tick(consumer)
            return
        # poll returns at the first record; draining what else is already fetched batches the
        # transaction without waiting for more.
        messages = [first, *consumer.consume(self.max_batch - 1, 0)]
        batch = self._admit(messages, now_ms())
        if batch.offsets:
            self._forward(batch)

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise DelayServiceError("the delay service is not running: call run()")
        return self._consumer

    def _admit(self, messages: Sequence[Message], now: int) -> Batch:
        runs: dict[Key, list[Message]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise DelayServiceError(f"fatal consumer error: {error.str()}")
                if error.code() in UNREACHED_CODES:
                    self.health.trouble(error.str())
                else:
                    log.warning("consumer error: %s", error.str())
                continue
            key = (str(message.topic()), int(message.partition() or 0))
            # Records of a held partition fetched before the pause are fetched again later.
            if key not in self._tiers or key in self._holds:
                continue
            runs.setdefault(key, []).append(message)
        try:
            return self._admit_runs(runs, now)
        except KafkaException as exc:
            # Checking a target not seen before found no broker to list the topics: nothing of
            # the poll is forwarded, and it is read again (the next check waits for the brokers).
            if not self.health.failed(exc):
                raise
            starts = {key: int(run[0].offset() or 0) for key, run in runs.items()}
            self._rewind(Batch(starts=starts), refused=False, why=exc)
            return Batch()

    def _admit_runs(self, runs: dict[Key, list[Message]], now: int) -> Batch:
        batch = Batch()
        self._refreshed = False
        consumer = self._require_consumer()
        for key, run in runs.items():
            # The gate stops at the first record not due, so exactly the admitted get planned.
            admission = gate.admit(self._plan_run(run, self._tiers[key], now, batch), now)
            batch.starts[key] = int(run[0].offset() or 0)
            if admission.count:
                last = run[admission.count - 1]
                batch.offsets.append(TopicPartition(key[0], key[1], int(last.offset() or 0) + 1))
            if admission.next_due_ms is not None:
                held = run[admission.count]
                self._holds.hold(consumer, key, Hold(int(held.offset() or 0),
                                                     admission.next_due_ms, Why.DUE,
                                                     held.timestamp()[1]))
        self._report_paused()
        return batch

    def _plan_run(self, run: Sequence[Message], tier: Tier, now: int,
                  batch: Batch) -> Iterator[int | None]:
        """Yield each record's gate due time, adding its copy to the batch if it is due."""
        source = (str(run[0].topic()), int(run[0].partition() or 0))
        landed = self._landed.of(source)
        for message in run:
            offset = int(message.offset() or 0)
            if landed is not None and offset in landed:
                yield None  # forwarded already, by a try that was refused another record
                continue
            record_headers: list[tuple[str, bytes | None]] = []
            try:
                record_headers = kafka.message_headers(message)  # a name not UTF-8: malformed
                target, final_due = self._read(record_headers)
            except (_Malformed, MalformedHeader) as bad:
                error = bad.error if isinstance(bad, _Malformed) else bad
                batch.add(source, offset, self._dead_letter(message, record_headers, error, now))
                batch.malformed += 1
                yield None
                continue
            kind, written = message.timestamp()
            # Without a timestamp the hop's start is unknown; the final due time is a safe
            # stand-in, never early, and cannot block the partition for longer than the record
            # itself asked to wait.
            due = final_due if kind == TIMESTAMP_NOT_AVAILABLE else hop_due(
                written, tier.delay_ms, final_due)
            if due <= now:
                next_tier = self.tiers.next_hop(final_due - now)
                topic = target if next_tier is None else next_tier.topic
                batch.add(source, offset, kafka.OutRecord(
                    topic, message.value(), message.key(), record_headers, timestamp_ms=now))
                if next_tier is None:
                    batch.delivered[target] = batch.delivered.get(target, 0) + 1
                    batch.late_by[len(batch.out) - 1] = now - final_due
                else:
                    batch.hops[topic] = batch.hops.get(topic, 0) + 1
            yield due

    def _read(self, record_headers: list[tuple[str, bytes | None]]) -> tuple[str, int]:
        """The record's target and final due time; only these two headers matter here (the
        target's own consumer validates the rest), which keeps the per-record cost low."""
        try:
            due = h.read_due(record_headers)
            raw = h.last(record_headers, h.TARGET, null=None)
            if raw is None:
                null = any(name == h.TARGET for name, _ in record_headers)
                raise MalformedHeader(h.TARGET, None, f"{'a null value' if null else 'missing'}: "
                                      "the delay service needs the topic to deliver to")
            if due is None:
                raise MalformedHeader(h.DUE, None,
                                      "missing: the delay service needs the time to deliver at")
            target = self._targets.get(raw)
            if target is None:
                target = self._check_target(raw)
        except (MalformedHeader, InvalidArgument) as exc:
            raise _Malformed(exc) from exc
        return target, due

    def _check_target(self, raw: bytes) -> str:
        try:
            target = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedHeader(h.TARGET, raw, "not UTF-8 text") from exc
        check_target(target, self.tiers, h.TARGET)
        if not self._topic_exists(target):
            # A target that does not exist would fail the whole transaction again and again.
            raise InvalidArgument(h.TARGET, target, "no such topic on the cluster")
        # Only existing topics are remembered, so the cache is as small as the cluster's list.
        self._targets[raw] = target
        return target

    def _topic_exists(self, topic: str) -> bool:
        if topic in self._known_topics:
            return True
        if not self._refreshed:
            # One metadata call per poll at most, and only when a target is unknown.
            self._refreshed = True
            metadata = self._require_consumer().list_topics(timeout=10)
            # A topic being deleted can be listed without partitions (noida-db): a copy sent
            # there waits in the producer until it times out instead of being refused.
            self._known_topics = {name for name, meta in metadata.topics.items()
                                  if meta.error is None and meta.partitions}
        return topic in self._known_topics

    def _dead_letter(self, message: Message, record_headers: list[tuple[str, bytes | None]],
                     error: RedriveError, now: int) -> kafka.OutRecord:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        try:
            h.read_delivery(record_headers)
            kept = record_headers  # its group and origin still say where to replay it
        except MalformedHeader:
            kept = h.set_aside(record_headers)
        dead_headers = h.replace(kept, {
            h.REASON: "malformed",
            h.ERROR_TYPE: qualified_name(type(error)),
            h.ERROR_MESSAGE: f"{error} (record {where})",
        })
        log.warning("dead-lettering record %s: %s", where, error)
        return kafka.OutRecord(self.tiers.dead_letter, message.value(), message.key(),
                               dead_headers, timestamp_ms=now)

    # --- forwarding -------------------------------------------------------------------------

    def _forward(self, batch: Batch) -> bool:
        """Forward the batch; False when the brokers are away or the producer failed, when
        nothing more should be tried this poll."""
        consumer = self._require_consumer()
        refusing = any(key in self._refusals for key in batch.starts)
        if self._transactions is not None and refusing and len(batch.starts) > 1:
            return self._forward_apart(batch)
        try:
            if self._transactions is not None:
                self._transactions.commit(batch.out, batch.offsets,
                                          consumer.consumer_group_metadata())
            elif refusing:
                self._forward_each(batch)
                return True
            else:
                assert self._producer is not None
                kafka.produce_acked(self._producer, batch.out, self._timeout_s)
                # A synchronous commit waits for as long as the brokers are away (librdkafka
                # defers it until a coordinator answers), which would keep the service from
                # noticing an outage or stopping. A commit that fails leaves the offsets to the
                # next one, or the records to be forwarded again: at-least-once.
                consumer.commit(offsets=batch.offsets, asynchronous=True)
        except ProducerFenced as exc:
            raise DelayServiceError(str(exc)) from exc
        except (KafkaException, DeliveryFailed, TransactionAborted, RecordTooLarge) as exc:
            # An outage is logged once, by the health; other failures each time, at the pace
            # of the refusals' pauses. An aborted transaction is judged by what aborted it.
            outage = self.health.failed(exc)
            failed_for_good = producer_failed(exc)
            if self._producer is not None and failed_for_good:
                log.warning("the producer failed for good; a new one replaces it")
                discard_producer(self._producer)
                self._producer = self._new_producer()
            refused = not (outage or failed_for_good or passing_failure(exc))
            if refused:
                self._forget_targets()
            if refused and self._transactions is not None and len(batch.starts) > 1:
                # Held together, the partitions would come back together, and the one refused
                # copy would abort them all again at every try.
                return self._forward_apart(batch)
            self._rewind(batch, refused=refused, why=exc)
            return not (outage or failed_for_good)
        self.health.ok()
        self._refusals.forget(batch.starts)
        if self._landed:
            self._landed.committed(batch.offsets)
        self._count(batch)
        return True

    def _forward_apart(self, batch: Batch) -> bool:
        """Each tier partition's copies and offset in a transaction of its own, so that only the
        partitions whose copies the broker refuses wait (as without transactions)."""
        parts = batch.split(self.tiers.dead_letter)
        for index, part in enumerate(parts):
            if not self._forward(part):
                for rest in parts[index + 1:]:
                    self._rewind(rest, refused=False, why=DelayServiceError(
                        "not tried: the transaction of another tier partition failed"))
                return False
        return True

    def _forget_targets(self) -> None:
        """After a refusal: a target deleted since it was checked is refused until it is
        checked again, and then dead-lettered instead of holding its tier partition for good."""
        self._targets.clear()
        self._known_topics.clear()

    def _forward_each(self, batch: Batch) -> None:
        """Forward at-least-once with each copy's own outcome (see settling)."""
        assert self._producer is not None
        consumer = self._require_consumer()
        outcomes = kafka.produce_each(self._producer, batch.out, self._timeout_s)
        settlement = settle(batch.origins, outcomes, batch.offsets)
        self.health.ok()
        self._landed.note(settlement, batch.origins)
        consumer.commit(offsets=settlement.commits, asynchronous=True)
        self._landed.committed(settlement.commits)
        self._refusals.forget([key for key in batch.starts if key not in settlement.refused])
        if settlement.refused:
            # Only the refused records and those behind them that did not land are read again.
            assert settlement.why is not None
            self._forget_targets()
            # No sources: every refused partition is held, whichever topic refused it.
            self._rewind(Batch(out=batch.out, starts=settlement.refused), refused=True,
                         why=settlement.why)
        self._count(batch.part(settlement.landed, self.tiers.dead_letter))

    def _committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The outcome of an at-least-once commit (served by the consumer's poll)."""
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in partitions
                  if tp.error is not None]
        if error is not None and not self.health.failed(KafkaException(error)):
            log.warning("a commit failed: %s", error.str())
        elif error is None and failed:
            log.warning("a commit failed for %s", ", ".join(failed))

    def _rewind(self, batch: Batch, *, refused: bool, why: BaseException) -> None:
        """Read the batch's tier partitions again from its first records: at once after an
        outage or a failed producer, after a growing pause when the broker refused a copy,
        for the partitions whose records went to the topic that refused it (all of the batch's
        where that is not said, as in an aborted transaction)."""
        consumer = self._require_consumer()
        keys = [key for key in batch.starts if key in self._tiers]
        self._holds.release(consumer, keys)
        culprits = (batch.sources.get(why.topic)
                    if isinstance(why, DeliveryFailed | RecordTooLarge) else None) or set(keys)
        at = now_ms()
        for key in keys:
            offset = batch.starts[key]
            if refused and key in culprits:
                pause_s = self._refusals.hold(self._holds, consumer, key, offset, at)
                log.warning("forwarding %d record(s) failed: %s; %s[%d] is read again from "
                            "offset %d in %g s", len(batch.out), why, key[0], key[1], offset,
                            pause_s)
            else:
                consumer.seek(TopicPartition(key[0], key[1], offset))
        self._report_paused()

    def _count(self, batch: Batch) -> None:
        for topic, count in [*batch.hops.items(), *batch.delivered.items()]:
            self.metrics.forwarded(topic, count)
        for late in batch.late_by.values():
            self.metrics.late_by(late / 1000)
        for _ in range(batch.malformed):
            self.metrics.dead_lettered(self.tiers.dead_letter, "malformed")
