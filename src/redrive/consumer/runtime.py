"""RetryingConsumer: a plain-Python Kafka consumer with non-blocking retries and dead letters.

One consumer group reads the main topics and the group's retry topics (from `topics.plan`, and
those of an earlier policy while they hold records: `topics.former_retry_topics`); the retry
partitions are fetched by a reader of their own (`redrive.consumer.readers`), whose records are
taken first, and main batches are kept short (`redrive.consumer.pace`), so a due retry never waits
behind a backlog of the main topics. Each poll batch is handled record by record, in order:

- a record whose `redrive-group` names another group is skipped and committed;
- a record not yet due (`redrive-due` ahead of the local clock) holds its partition: the partition
  is paused and sought back to it, the rest of the batch on that partition is dropped (fetched
  again after the seek, or kept by the retry reader), and it is resumed when the record is due.
  `poll()` keeps running meanwhile, never blocking past the next due time, so the member stays
  within max.poll.interval.ms and other partitions go on;
- the handler is called; on success the record is finished;
- on an error the policy retries in place (Disposition.IN_PLACE), the partition is held the same
  way for the in-place backoff and the record is tried again, up to `InPlace.retries` times (see
  `redrive.consumer.in_place` for what a rebalance does to that budget);
- any other error, or an exhausted in-place budget, is routed with `routing.route` to a retry topic
  or the dead-letter topic; the record is finished once its copy is acknowledged.
- with a `DeadLetterLimit` in the policy, a dead letter that would pass it holds its partition at
  that record instead (`redrive.consumer.brakes`) until `redrive resume` or the cool-off.

After each batch the committer (`redrive.consumer.committer`) produces its copies and commits
its offsets: at-least-once without waiting, never past a record unfinished or whose copy is
unacknowledged (a failed delivery rewinds the batch); transactional, copies and offsets as one
Kafka transaction, so that after any crash no copy is visible twice to read_committed readers.

Rebalance callbacks run only inside `poll()`, between batches. On revoke and close, the runtime
waits for the unconfirmed copies and commits every batch acknowledged (on lost, nothing of the
lost partitions; on close, for timeout_s at most), then drops the partitions' holds and state.

Through a broker outage the loop goes on (`redrive.kafka.health`): nothing unconfirmed is
committed, the outage is logged once (`redrive_broker_up`), a producer that failed for good is
replaced, and a stop does not wait for the brokers' return (`redrive.kafka.closing`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from redrive import arguments, gate, kafka, retention
from redrive import headers as h
from redrive.backends import BoundBackend, RetryBackend, RetryTopics, Verdict
from redrive.clock import now_ms
from redrive.consumer.batch import Batch, Copy
from redrive.consumer.brakes import Brake
from redrive.consumer.committer import Committer, default_transactional_id
from redrive.consumer.in_place import InPlaceRetries
from redrive.consumer.pace import MainBatchSize
from redrive.consumer.plain import handle_plain, not_awaited
from redrive.consumer.prefetch import records_to_admit
from redrive.consumer.readers import CONSUMER_OVERRIDES, Readers
from redrive.consumer.routes import Routes
from redrive.errors import InvalidArgument, MalformedHeader, RedriveError, UnknownTopic
from redrive.former_looks import FormerLooks
from redrive.kafka.health import UNREACHED_CODES, BrokerHealth
from redrive.kafka.holds import Hold, Holds, Why
from redrive.kafka.records import PartitionKey, headers_or_malformed
from redrive.kafka.transactions import TransactionalProducer
from redrive.metrics import SKIPPED_OTHER_GROUP, Metrics
from redrive.policy import Disposition, RetryPolicy
from redrive.record import NO_HISTORY, Delivery, ErrorInfo, Record, new_record
from redrive.routing import DeadLetter
from redrive.signals import stop_on_signals
from redrive.topics import check_name, check_names, former_retry_topics, plans

log = logging.getLogger("redrive.consumer")

Handler = Callable[[Record], object]

# The handler-time histogram costs more per observation than a trivial handler: it sees the first
# record of each batch and one in HANDLER_SAMPLE after it (every call when records trickle in).
HANDLER_SAMPLE = 16
DEFAULT_BATCH_SIZE = 500
DEFAULT_POLL_TIMEOUT_S = 0.1
DEFAULT_TIMEOUT_S = 30.0
# How long a poll may wait while copies are unconfirmed, so their offsets are committed soon.
CONFIRM_POLL_S = 0.01
# How long the member's poll may wait while the retry reader has partitions: a retry fetched
# meanwhile is taken at the next turn of the loop.
RETRY_POLL_S = 0.02


class RetryingConsumer:
    """Consume `topics` in `group`, calling `handler` once per record, retrying failures.

    connection: a bootstrap address or a librdkafka config mapping (security settings etc.).
    config / producer_config: librdkafka overrides for the consumer / the producer of copies
        (for example {"group.instance.id": "worker-1", "session.timeout.ms": 10000}).
    transactional: copies and consumed offsets of each batch in one Kafka transaction.
    transactional_id: defaults to redrive-GROUP-INSTANCE with a group.instance.id (so a restarted
        instance fences its predecessor), else to a random one.
    metrics: the Metrics to count into (a new one by default); metrics_port serves it over HTTP.
    create_topics: create the plan's missing retry and dead-letter topics at start.
    batch_size / poll_timeout_s: records per poll and the longest wait of one poll; a poll never
        waits past the time the next held partition is due.
    retry_backend: where failed records wait for their retry: the group's retry topics
        (RetryTopics, the default), the delay service's shared tiers (DelayQueue) or a database
        (redrive.store.StoreBackend).

    run() handles records until stop() or SIGTERM/SIGINT (when run from the main thread), then
    commits what it finished and leaves, so the group rebalances at once. timeout_s bounds a
    copy's wait for its acknowledgement, and a close's for brokers that do not answer.
    """

    def __init__(self, connection: kafka.Connection, topics: str | Sequence[str], group: str,
                 policy: RetryPolicy, handler: Handler, *, transactional: bool = False,
                 transactional_id: str | None = None, metrics_port: int | None = None,
                 metrics: Metrics | None = None, config: Mapping[str, Any] | None = None,
                 producer_config: Mapping[str, Any] | None = None, create_topics: bool = True,
                 batch_size: int = DEFAULT_BATCH_SIZE, retry_backend: RetryBackend | None = None,
                 poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.topics = check_names("topics", topics)
        self.group = check_name("group", group)
        arguments.check_instance("policy", policy, RetryPolicy, "a RetryPolicy")
        arguments.check_function("handler", handler, "one Record")
        arguments.check_int("batch_size", batch_size, 1, 1_000_000)
        arguments.check_positive("poll_timeout_s", poll_timeout_s)
        arguments.check_positive("timeout_s", timeout_s)
        if metrics_port is not None:
            arguments.check_int("metrics_port", metrics_port, 0, 65535)
        arguments.check_optional("retry_backend", retry_backend, RetryBackend, "a RetryBackend "
                                 "(RetryTopics(), DelayQueue(...) or StoreBackend(...))")
        arguments.check_optional("metrics", metrics, Metrics, "a redrive.metrics.Metrics")
        arguments.check_text("transactional_id", transactional_id)
        arguments.check_instance("create_topics", create_topics, bool, "True or False")
        self.retry_backend = retry_backend if retry_backend is not None else RetryTopics()
        self._backend = self.retry_backend.bind(self.group)
        if transactional and not self._backend.transactions_supported:
            raise InvalidArgument("transactional", transactional,
                                  f"{self.retry_backend!r} cannot join Kafka transactions")
        self.policy = policy
        self.handler = handler
        self.transactional = bool(transactional)
        self.metrics = metrics if metrics is not None else Metrics("consumer", self.group)
        self.health = BrokerHealth(f"group {self.group}", self.metrics, topic=self.topics[0])
        self._connection = self.health.watch(kafka.client_config(connection))
        self._config = {**CONSUMER_OVERRIDES, **arguments.check_settings("config", config)}
        self._producer_config = arguments.check_settings("producer_config", producer_config)
        self._transactional_id = (transactional_id
                                  or default_transactional_id(self.group, self._config))
        self._metrics_port = metrics_port
        self._create_topics = create_topics
        self._pace = MainBatchSize(batch_size)
        self._poll_timeout_s = float(poll_timeout_s)
        self._timeout_s = float(timeout_s)

        self.plans = plans(policy, self.topics, self.group)
        self._main_of: dict[str, str] = {}
        for main, plan in self.plans.items():
            for name in self._backend.consumed_topics(plan):
                self._main_of[name] = main
        self._holds = Holds()
        limit = policy.dead_letter_limit
        self._brake = (None if limit is None else
                       Brake.of(limit, self.group, self.metrics, self._connection))
        self._in_place = InPlaceRetries()
        self._former_looks = FormerLooks(self._connection, f"group {self.group}")
        self._routes = Routes(self._backend, policy, self.group)
        # Successes clear in-place state only when some topic's policy retries in place.
        self._in_place_policies = any(self._backend.policy_for(topic, policy).in_place
                                      for topic in self.topics)
        self._assigned: set[PartitionKey] = set()
        self._partitions: dict[str, int] = {}
        self._stopping = threading.Event()
        # The same as _stopping, cheaper to test per record (and readable from C).
        self._stop = bytearray(1)
        backend_type = type(self._backend)
        # A backend with no admit/succeeded hooks lets records without headers skip them.
        self._plain_backend = (backend_type.admit is BoundBackend.admit
                               and backend_type.succeeded is BoundBackend.succeeded)
        # Only a backend that looks records up (the store) pays for the pre-pass over a batch.
        self._prefetching = backend_type.prefetch is not BoundBackend.prefetch
        self._consumer: Readers | None = None
        self._committer: Committer | None = None
        self._closed = False

    @property
    def subscribed(self) -> list[str]:
        return list(self._main_of)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the plan's topics, the clients, and join the group (run() does it if needed)."""
        if self._consumer is not None:
            return
        if self._closed:
            raise RedriveError(f"consumer of group {self.group!r} is closed; make a new one")
        producer: Producer | None = None
        if not self.transactional:
            # The producer first: an idempotent producer writes no copy in its first 0.5-1 s (it
            # asks for its id once connected); made now, that overlaps the set-up and the join.
            producer = self._new_producer()
        try:
            admin = kafka.admin_beside(self._connection, self._producer_config)
            if self._create_topics:
                for warning in self._backend.prepare(admin, self.plans):
                    log.warning("%s", warning)
            self._partitions = kafka.topic_partitions(admin)
            if missing := [name for name in self.subscribed if name not in self._partitions]:
                raise UnknownTopic(missing[0])
            self._backend.check(self._partitions)
            retention.check(admin, self._backend.waits(self.plans))
            self._read_former(self._partitions)
        except BaseException:
            producer = None  # nothing was produced: dropping it releases it
            raise
        transactions: TransactionalProducer | None = None
        if self.transactional:
            transactions = TransactionalProducer(
                self._connection, self._transactional_id, overrides=self._producer_config,
                timeout_s=self._timeout_s, stopping=self._stopping)
            transactions.start()
        retry_topics = [name for name, main in self._main_of.items() if name != main]
        self._consumer = Readers.open(self._connection, self.group,
                                      {**self._config, "on_commit": self._committed},
                                      retry_topics, self.metrics)
        self._committer = Committer(self.group, self._consumer, self._backend, self.metrics,
                                    self._assigned, self._timeout_s, self.health,
                                    producer=producer, make_producer=self._new_producer,
                                    transactions=transactions, holds=self._holds,
                                    stopping=self._stopping)
        self._subscribe()
        # A series from the start, at 0: not only once a partition was first held.
        self.metrics.paused_partitions(0)
        if self._metrics_port is not None:
            self.metrics.serve(self._metrics_port)

    def run(self) -> None:
        """Handle records until stop() (or SIGTERM/SIGINT in the main thread), then close."""
        self.start()
        consumer = self._require_consumer()
        committer = self._require_committer()
        try:
            with stop_on_signals(self.stop):
                while not self._stopping.is_set():
                    self._release_due()
                    if self._brake is not None and self._brake.stopped:
                        self._brake.poll_resumes(consumer, self._holds)
                        self.metrics.paused_partitions(len(self._holds))
                    wait_s = self._holds.wait_s(now_ms(), self._poll_timeout_s)
                    if committer.unconfirmed:
                        wait_s = min(wait_s, CONFIRM_POLL_S)
                    retries = consumer.consume_retries(self._pace.most)  # [] if it reads none
                    if consumer.reading_retries:
                        wait_s = 0.0 if retries else min(wait_s, RETRY_POLL_S)
                    messages = consumer.consume(self._pace.size(consumer.reading_retries), wait_s,
                                                retries)
                    if messages:
                        self._handle_batch(messages)
                    elif committer.unconfirmed:
                        committer.settle()
                    self.health.tick(consumer.member)
                    self._update_gauges()
                    self._former_looks.again(self._read_former)
        finally:
            self.close()

    def stop(self) -> None:
        """Ask run() to stop after the record in hand; safe from any thread or signal handler."""
        self._stop[0] = 1
        self._stopping.set()

    def close(self) -> None:
        """Commit what is finished and acknowledged (nothing unfinished), leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop[0] = 1
        self._stopping.set()
        deadline = time.monotonic() + self._timeout_s  # a stop must fit a grace period
        if self._consumer is not None:
            try:
                self._require_committer().settle_all(deadline=deadline)
            finally:
                self._consumer.close(deadline, f"group {self.group}")
        if self._committer is not None:
            self._committer.close(deadline)
        if self._brake is not None:
            self._brake.close()
        self._former_looks.close()

    def __enter__(self) -> RetryingConsumer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- one batch -----------------------------------------------------------------------------

    def _handle_batch(self, messages: Sequence[Message]) -> None:
        """Handle a poll batch in order, count it in the metrics, then hand it to the committer."""
        if self._prefetching:
            self._backend.prefetch(records_to_admit(messages, self.group,
                                                    self._backend.sequential))
        batch = Batch()
        self._routes.new_batch()
        try:
            self._pace.timed(self._handle_records, messages, batch)
        finally:
            # So that the times taken before a BaseException out of a handler are observed too.
            self.metrics.handler_took_all(batch.handler_times)
            self.metrics.late_by_all(batch.lateness)
        for name, count in batch.processed.items():
            self.metrics.processed(name, count)
        self._require_committer().complete(batch)

    def _handle_records(self, messages: Sequence[Message], batch: Batch) -> None:
        """Handle a poll batch's records in order into `batch`.

        Records of one partition come in runs; per-partition bookkeeping (taken? stopped? main
        topic, last finished offset, successes) is done once per run, and records without
        headers go to `handle_plain`, which takes them until one needs more.
        """
        first, finished, stopped = batch.first, batch.finished, batch.stopped
        assigned = self._assigned
        main_of = self._main_of
        handler = self.handler
        processed = batch.processed
        plain = self._plain_backend
        track_in_place = self._in_place_policies
        brake = self._brake
        handler_times = batch.handler_times
        stop = self._stop
        topic: str | None = None
        partition = -1
        tp: PartitionKey = ("", -1)
        main = ""
        skip = True  # the current run's partition is revoked or stopped in this batch
        ok = 0  # successes of the current run not yet counted in `processed`
        last = -1  # the current run's last finished offset not yet written to `finished`
        index, count = 0, len(messages)
        while index < count:
            if stop[0]:
                break  # the rest is handed back: it is not finished, so it is not committed
            message = messages[index]
            index += 1
            error = message.error()
            if error is not None:
                self._consume_error(error)
                continue
            m_topic: str = message.topic()  # type: ignore[assignment]
            m_partition: int = message.partition()  # type: ignore[assignment]
            offset: int = message.offset()  # type: ignore[assignment]
            if m_partition != partition or m_topic != topic:
                if ok:
                    processed[main] += ok
                    ok = 0
                if last >= 0:
                    finished[tp] = last
                    last = -1
                topic, partition = m_topic, m_partition
                tp = (m_topic, m_partition)
                main = main_of.get(m_topic, m_topic)
                # A partition revoked in this poll's callbacks may still have records in the
                # batch; records behind a held one were dropped by the seek back to it.
                skip = tp not in assigned or tp in stopped
                if not skip and tp not in first:
                    first[tp] = offset
            if skip:
                continue
            raw_headers = headers_or_malformed(message)
            if raw_headers is not None or not plain:
                if ok:
                    processed[main] += ok
                    ok = 0
                if last >= 0:
                    finished[tp] = last
                    last = -1
                self._handle(message, tp, offset, batch, raw_headers, main)
                skip = tp in stopped
                continue
            # No headers: no redrive history, no due time, another group's filter cannot apply,
            # and the backend has nothing to admit or record.
            index, handled, handled_to, batch.until_sample, failed, failure = handle_plain(
                messages, index - 1, m_topic, m_partition, handler, batch.until_sample,
                HANDLER_SAMPLE, handler_times, stop)
            if handled:
                ok += handled
                last = handled_to
                if track_in_place:
                    self._in_place.clear(tp)
                if brake is not None:
                    brake.succeeded(tp, handled)
            if failed is None:
                continue
            assert failure is not None
            if ok:
                processed[main] += ok
                ok = 0
            if last >= 0:
                finished[tp] = last
                last = -1
            self._failed(failed, failure, tp, batch, main)
            failure = None  # its traceback holds a frame of this batch: see ErrorInfo.detached
            skip = tp in stopped
        if ok:
            processed[main] += ok
        if last >= 0:
            finished[tp] = last

    def _handle(self, message: Message, tp: PartitionKey, offset: int, batch: Batch,
                raw_headers: Any, main: str) -> None:
        # Header names that are not UTF-8 make the record malformed: its headers cannot be read.
        malformed = raw_headers if isinstance(raw_headers, MalformedHeader) else None
        headers = h.normalize(None if malformed is not None else raw_headers)
        delivery = NO_HISTORY
        if headers:  # without redrive's headers read_delivery gives NO_HISTORY
            try:
                delivery = h.read_delivery(headers)
            except MalformedHeader as exc:
                malformed = exc
        record = new_record(tp[0], tp[1], offset, message.timestamp()[1], message.key(),
                            message.value(), headers, delivery)
        owner = delivery.group if malformed is None else h.readable_group(headers)
        if owner is not None and owner != self.group:
            self.metrics.skipped(main, SKIPPED_OTHER_GROUP)
            batch.finish(tp, offset)
            return
        if malformed is not None:
            self._route(record, malformed, tp, batch, main, None)
            return
        if delivery.due_ms is not None:
            started_ms = now_ms()
            if not gate.is_due(delivery.due_ms, started_ms):
                self._hold(tp, record, delivery.due_ms, Why.DUE)
                batch.stop(tp)
                return
            batch.lateness.append((started_ms - delivery.due_ms) / 1000.0)
        verdict = self._backend.admit(record)
        if verdict is not Verdict.PROCESS:
            self.metrics.skipped(main, verdict.value)
            batch.finish(tp, offset)
            return

        failure: Exception | None = None
        started = time.perf_counter()
        try:
            if (returned := self.handler(record)) is not None:
                not_awaited(returned)
        except Exception as exc:
            failure = exc
        batch.until_sample -= 1
        if not batch.until_sample:
            batch.until_sample = HANDLER_SAMPLE
            batch.handler_times.append(time.perf_counter() - started)

        if failure is None:
            self._backend.succeeded(record)
            batch.processed[main] += 1
            self._in_place.clear(tp)
            if self._brake is not None:
                self._brake.succeeded(tp)
            batch.finish(tp, offset)
            return
        self._failed(record, failure, tp, batch, main)
        del failure  # its traceback holds this frame: see ErrorInfo.detached

    def _failed(self, record: Record, failure: Exception, tp: PartitionKey, batch: Batch,
                main: str) -> None:
        policy = self._backend.policy_for(main, self.policy)
        # Built once: the in-place decision and routing both classify it, and its trace costs.
        error = ErrorInfo.from_exception(failure)
        in_place = policy.in_place
        if in_place is not None and policy.disposition(error) is Disposition.IN_PLACE:
            retry = self._in_place.fail(tp, record.offset, in_place.retries)
            if retry is not None:
                self._hold(tp, record, now_ms() + in_place.backoff.delay_ms(retry), Why.IN_PLACE)
                self.metrics.retried_in_place(main)
                batch.stop(tp)
                return
        self._in_place.clear(tp)
        self._route(record, error, tp, batch, main, record.delivery)

    def _route(self, record: Record, error: Exception | ErrorInfo, tp: PartitionKey,
               batch: Batch, main: str, delivery: Delivery | None) -> None:
        decision = self._routes.route(record, error, main, delivery)
        if isinstance(decision, DeadLetter) and self._brake is not None and self._brake.stops(
                self._require_consumer(), self._holds, tp, record, main):
            self.metrics.paused_partitions(len(self._holds))
            batch.stop(tp)
            return
        out = self._backend.failed(record, decision, self._partitions)
        batch.route(Copy(out, decision, main, tp, record.offset))

    # --- holds ---------------------------------------------------------------------------------

    def _hold(self, tp: PartitionKey, record: Record, until_ms: int, why: Why) -> None:
        self._holds.hold(self._require_consumer(), tp,
                         Hold(record.offset, until_ms, why, record.timestamp_ms))
        self.metrics.paused_partitions(len(self._holds))

    def _release_due(self) -> None:
        released = self._holds.release_due(self._require_consumer(), now_ms())
        if released:
            if self._brake is not None:
                self._brake.released(released)
            # Set here, not after the batch: a scrape meanwhile must not count them as held.
            self.metrics.paused_partitions(len(self._holds))

    def _update_gauges(self) -> None:
        self.metrics.oldest_pending_retry_since(self._holds.oldest_since_ms())

    # --- subscription and rebalances ------------------------------------------------------------

    def _read_former(self, partitions: Mapping[str, int]) -> None:
        """Read an earlier policy's retry topics too while they hold records (see topics.py)."""
        found = former_retry_topics(self._connection, self.group, self.topics, self._main_of,
                                    partitions)
        self._main_of.update(found)
        if found and self._consumer is not None:  # else start() subscribes to them
            self._consumer.read_retry_topics(found)
            self._subscribe()

    def _subscribe(self) -> None:
        self._require_consumer().member.subscribe(
            self.subscribed, on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned.update((str(p.topic), int(p.partition)) for p in partitions)
        self._require_consumer().assigned(partitions)
        self.metrics.rebalanced("assign")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(consumer, partitions, "revoke")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(consumer, partitions, "lost")

    def _forget(self, consumer: Consumer, partitions: list[TopicPartition], kind: str) -> None:
        tps = [(str(p.topic), int(p.partition)) for p in partitions]
        # Batches whose copies are still unconfirmed: wait for them and commit what was
        # acknowledged while the partitions are still ours (a lost partition is not ours any
        # more: nothing of it is committed, its next owner handles those records again).
        self._require_committer().settle_all(exclude=tps if kind == "lost" else (), leaving=tps)
        readers = self._require_consumer()
        self._holds.release(readers, tps)
        readers.revoked(partitions)
        self._in_place.drop(tps)
        if self._brake is not None:
            self._brake.forget(tps)
        self._assigned.difference_update(tps)
        self.metrics.rebalanced(kind)
        self.metrics.paused_partitions(len(self._holds))

    # --- helpers -------------------------------------------------------------------------------

    def _consume_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if error.code() in UNREACHED_CODES:
            self.health.trouble(error.str())  # logged once per outage, not once per fetch
            return
        log.warning("group %s: consumer error: %s", self.group, error.str())

    def _committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if self._committer is not None:
            self._committer.committed(error, partitions)

    def _new_producer(self) -> Producer:
        return kafka.producer(self._connection, overrides=self._producer_config)

    def _require_consumer(self) -> Readers:
        if self._consumer is None:
            raise RedriveError(f"consumer of group {self.group!r} is not started; call start()")
        return self._consumer

    def _require_committer(self) -> Committer:
        if self._committer is None:
            raise RedriveError(f"consumer of group {self.group!r} is not started; call start()")
        return self._committer

