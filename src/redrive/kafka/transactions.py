"""Produce records and commit consumed offsets in one Kafka transaction, one place for all of it.

The consumer runtime (copies and offsets of a batch), the delay service (forwarded records and
offsets of a poll) and replay (copies and their log entries) each run their transactions here, so
that each failure is handled one way:

- an error the transaction can be aborted after: it is aborted, nothing of it becomes visible to
  read_committed readers, and `TransactionAborted` tells the caller to rewind and try again;
- a retriable error while committing: the commit is resumed, as librdkafka asks, until it
  commits or fails otherwise (see `_commit`);
- a fatal error (the producer's idempotence state is lost, as after a broker restart:
  OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID): the producer cannot go on, so a new one is
  made with the same transactional id. Its initialisation fences the old epoch and aborts what
  the old producer left open, and the caller gets `TransactionAborted` as above. This is what
  Kafka Streams does; without it one broker restart would end a transactional runtime;
- fencing (another producer started with the same transactional id: a newer instance of the
  same service): making a new producer would fence that one in turn, so `ProducerFenced` is
  raised and the caller stops.

A caller that is stopping (its `stopping` event set) gets no commit tried again, an abort that
waits `closing.LEAST_S` at most (a broker that answers at all aborts in milliseconds) and no new
producer: a stop must end in about `timeout_s` even while no broker answers. The producer's
requests time out after `timeout_s` too (librdkafka's socket.timeout.ms, 60 s by default): a
call such as send_offsets_to_transaction was measured to return only once both its own timeout
and its request's had passed. A transaction left open by a stop is aborted by the broker after
transaction.timeout.ms, or at once by the next producer with the same transactional id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from redrive.errors import BrokerUnavailable, DeliveryFailed, RedriveError
from redrive.kafka.admin import UNANSWERED
from redrive.kafka.causes import drop_stack
from redrive.kafka.closing import LEAST_S
from redrive.kafka.config import Connection, client_config, producer
from redrive.kafka.produce import Shrink, flush_closing, produce
from redrive.kafka.records import OutRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
ProducerFactory = Callable[..., Producer]

# Error codes meaning that another producer took this transactional id over.
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                     KafkaError.INVALID_PRODUCER_EPOCH})
_REQUEST_TIMEOUT = "socket.timeout.ms"


class TransactionAborted(RedriveError):
    """The transaction was aborted: nothing of it is visible; rewind and try again."""


class ProducerFenced(RedriveError):
    """Another producer took this transactional id over: this one must stop."""

    def __init__(self, transactional_id: str, why: str) -> None:
        self.transactional_id = transactional_id
        super().__init__(f"transactional.id={transactional_id!r} was fenced (another instance "
                         f"with the same id started?): {why}")


class TransactionalProducer:
    """A transactional producer that outlives its fatal errors.

    connection / overrides: as for `kafka.producer`; `make` builds the producer from the same
    arguments (a test passes one that fails on purpose); `stopping`: the caller's stop, set from
    any thread (see the module).
    """

    def __init__(self, connection: Connection, transactional_id: str, *,
                 overrides: Mapping[str, Any] | None = None, timeout_s: float = 30.0,
                 make: ProducerFactory = producer,
                 stopping: threading.Event | None = None) -> None:
        self.transactional_id = transactional_id
        self._connection = connection
        self._overrides = dict(overrides or {})
        user = {} if isinstance(connection, str) else connection
        if _REQUEST_TIMEOUT not in user and _REQUEST_TIMEOUT not in self._overrides:
            self._overrides[_REQUEST_TIMEOUT] = max(10, int(timeout_s * 1000))
        self._timeout_s = timeout_s
        self._make = make
        self._stopping = stopping or threading.Event()
        self._producer: Producer | None = None
        self.renewed = 0  # producers made again after a fatal error

    @property
    def producer(self) -> Producer:
        """The current producer: a new one after a fatal error."""
        if self._producer is None:
            raise TransactionAborted(f"the producer of transactional.id="
                                     f"{self.transactional_id!r} is not started")
        return self._producer

    def start(self) -> None:
        """Make the producer and initialise its transactions, which fences older producers with
        this id and aborts what they left open. Raises ProducerFenced, BrokerUnavailable when
        no broker answers in time, or KafkaException."""
        candidate = self._make(self._connection, transactional_id=self.transactional_id,
                               overrides=self._overrides)
        try:
            candidate.init_transactions(self._timeout_s)
        except KafkaException as exc:
            drop_stack(exc)
            self._raise_if_fenced(exc)
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() in UNANSWERED:
                # librdkafka's words ("retry call to resume") name neither the broker nor the
                # producer: a runtime starting during an outage would end with no clue.
                raise BrokerUnavailable(
                    str(client_config(self._connection)["bootstrap.servers"]),
                    f"initialising the transactions of transactional.id="
                    f"{self.transactional_id!r} got no answer in {self._timeout_s:g} s "
                    f"({error.str()})") from exc
            raise
        self._producer = candidate

    def commit(self, records: Iterable[OutRecord], offsets: Sequence[TopicPartition] = (),
               group_metadata: Any = None, *, shrink: Shrink | None = None) -> None:
        """Produce `records` and commit `offsets` for the consumer group in one transaction
        (`shrink`: as `produce` takes it)."""
        def body(producer_: Producer) -> None:
            for record in records:
                produce(producer_, record, shrink=shrink, wait_s=self._timeout_s)

        self.run(body, offsets, group_metadata)

    def run(self, body: Callable[[Producer], T], offsets: Sequence[TopicPartition] = (),
            group_metadata: Any = None) -> T:
        """One transaction: `body(producer)` produces, then `offsets` are sent for the group of
        `group_metadata` (a consumer's consumer_group_metadata()), then it commits.

        Raises TransactionAborted (nothing of it is visible; rewind and try again) or
        ProducerFenced (stop). An exception of `body` that is not redrive's or Kafka's aborts the
        transaction and propagates.
        """
        if self._producer is None:
            self._renew("the last producer could not be started")
        producer_ = self.producer
        try:
            producer_.begin_transaction()
            result = body(producer_)
            if offsets:
                producer_.send_offsets_to_transaction(list(offsets), group_metadata,
                                                      self._timeout_s)
            self._commit(producer_)
            return result
        except KafkaException as exc:
            drop_stack(exc)  # kept by confluent-kafka, it would keep this producer alive
            self._raise_if_fenced(exc)
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.fatal():
                self._renew(error.str())
            else:
                self._abort(producer_)
            raise TransactionAborted(f"transaction of transactional.id="
                                     f"{self.transactional_id!r} aborted: {exc.args[0]}") from exc
        except DeliveryFailed as exc:
            self._abort(producer_)
            raise TransactionAborted(f"transaction of transactional.id="
                                     f"{self.transactional_id!r} aborted: {exc}") from exc
        except BaseException:
            self._abort(producer_)
            raise

    def close(self) -> None:
        """Flush and drop the producer (see `flush_closing`: a fenced or fatally failed one's
        open transaction is aborted by the broker or the next producer with this id). Every
        transaction ends committed, which flushed it, or aborted, so what a stopping caller's
        producer still holds is an abort that timed out: it waits LEAST_S at most."""
        producer_, self._producer = self._producer, None
        if producer_ is not None:
            flush_closing(producer_, LEAST_S if self._stopping.is_set() else self._timeout_s,
                          self.transactional_id)

    def _commit(self, producer_: Producer) -> None:
        """Commit, resuming the commit after each retriable error for as long as it takes (an
        outage): librdkafka goes on committing in the background meanwhile, and an abort would
        fail as conflicting with it, while the broker may commit it all the same; the caller,
        told it was aborted, would then write the transaction's records a second time. Only a
        stop gives up, with the outcome unknown: the caller ends, and its successor reads on
        from whatever offsets the transaction left committed."""
        failures = 0
        while True:
            # Serves the producer's error callback, which commit_transaction does not: an outage
            # is then known (a runtime's BrokerHealth) while this call waits it out.
            producer_.poll(0)
            try:
                producer_.commit_transaction(self._timeout_s)
                if failures > 1:
                    log.warning("the transaction of %s committed after %d tries",
                                self.transactional_id, failures + 1)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if not (isinstance(error, KafkaError) and error.retriable()) \
                        or self._stopping.is_set():
                    raise
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "committing the transaction of %s failed (%s); trying again",
                    self.transactional_id, error.str())

    def _abort(self, producer_: Producer) -> None:
        try:
            producer_.abort_transaction(LEAST_S if self._stopping.is_set() else self._timeout_s)
        except KafkaException as exc:
            drop_stack(exc)  # as in run()
            self._raise_if_fenced(exc)
            error = exc.args[0]
            why = error.str() if isinstance(error, KafkaError) else str(error)
            if self._stopping.is_set():
                # Not a fatal error: the abort timed out, or conflicts with a commit still on
                # its way, whose outcome only the broker knows.
                log.warning("stopping with the transaction of %s unsettled (its abort: %s): "
                            "the broker completes a commit already sent, and aborts an open "
                            "transaction after transaction.timeout.ms or when a producer with "
                            "this id starts", self.transactional_id, why)
                self._drop()
                return
            # A producer that cannot even abort is replaced: its successor's start aborts what
            # it left open.
            self._renew(why)

    def _renew(self, why: str) -> None:
        """Drop the producer and start a new one with the same transactional id (none while
        stopping: the stop then ends with no producer)."""
        if self._producer is not None:
            log.error("transactional producer %s failed fatally (%s); %s",
                      self.transactional_id, why,
                      "stopping without a new one" if self._stopping.is_set()
                      else "starting a new one")
            self._drop()
        if self._stopping.is_set():
            return
        try:
            self.start()
        except (KafkaException, BrokerUnavailable) as exc:
            log.error("a new producer for %s could not be started yet: %s",
                      self.transactional_id, exc.args[0])
            return
        self.renewed += 1

    def _drop(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                old.purge()

    def _raise_if_fenced(self, exc: KafkaException) -> None:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() in _FENCED:
            raise ProducerFenced(self.transactional_id, error.str()) from exc
