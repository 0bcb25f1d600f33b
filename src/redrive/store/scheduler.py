"""The scheduler: republishes due stored retries to the topic their group reads.

Each pass claims due pending rows (FOR UPDATE SKIP LOCKED on PostgreSQL, so several schedulers
share the work; the database lock on SQLite, so they take turns) and commits the claim at once:
the rows are in flight, not yet dispatched. Then it builds each record (from the row in payload
mode, read back from Kafka by assign + seek in reference mode), produces them with delivery
confirmation, and marks them dispatched. No database lock is held while the broker acknowledges,
so the runtimes' writes never wait for it. A pass that took a whole batch leaves its marks to the
next pass, which follows at once and writes them in its claim's transaction.

A scheduler that dies after claiming leaves its rows claimed: any scheduler makes them pending
again once the claim is `claim_s` old (a minute, or the lease if shorter), and republishes them.
One that dies after the broker acknowledged leaves copies whose rows are claimed: the copies are
handled as usual, and only a row whose copy is not handled within the claim is republished, at
most one duplicate per crash, carrying the same original topic/partition/offset and attempt, which
is how the consuming runtime recognises and skips it.
A reference whose record Kafka no longer has (retention, compaction) dies with reason `expired`.

A row in flight holds a lease of `lease_s`: if its copy is not reported handled by then (the copy
was lost to retention, an offset reset or a deleted topic, or the group never came back), a
scheduler makes it pending again and the next pass republishes it. So nothing stays in flight
for good, and no operator has to requeue it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from redrive import headers as h
from redrive import kafka
from redrive.arguments import check_optional, check_positive, check_settings, check_text
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError, UnknownTopic
from redrive.kafka.health import BrokerHealth
from redrive.kafka.holds import Refusals
from redrive.kafka.produce import discard_producer, producer_failed
from redrive.kafka.ranges import PartitionRange, RangeReader, RangeReadFailed, range_consumer
from redrive.metrics import Metrics
from redrive.oversize import slimmed
from redrive.record import Origin
from redrive.signals import stop_on_signals
from redrive.store.claims import DueBatch
from redrive.store.database import StoreUnavailable
from redrive.store.notify import DeadHook, Notifier
from redrive.store.rows import StoredRetry
from redrive.store.schema import PAYLOAD
from redrive.store.store import RetryStore
from redrive.store.webhook import Webhook
from redrive.topics import partition_for

log = logging.getLogger("redrive.store.scheduler")

EXPIRED = "expired"
NO_DESTINATION = "unknown-topic"
CORRUPT = "corrupt"
DEFAULT_BATCH = 500
DEFAULT_IDLE_S = 0.05
# After a failed pass (the database or the brokers unreachable) the next waits this long,
# doubling after each further failure up to MAX_ERROR_PAUSE_S.
ERROR_PAUSE_S = 0.5
MAX_ERROR_PAUSE_S = 30.0
ORPHAN_SWEEP_S = 30.0
# Long enough for a consuming group's ordinary lag and restarts: a lease that runs out while a
# slow copy still waits to be read only costs a second copy.
DEFAULT_LEASE_S = 600.0
# Longer than a pass takes (its produce waits up to timeout_s), short enough that rows claimed
# by a scheduler that died come back soon.
CLAIM_S = 60.0
# A record read back is read alone: the broker should answer at once.
READER_OVERRIDES: Mapping[str, Any] = {"fetch.wait.max.ms": 10}
_UNKNOWN_CODES = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                            KafkaError.UNKNOWN_TOPIC_OR_PART})


@dataclass(frozen=True)
class Pass:
    """What one scheduler pass did."""

    published: int = 0
    expired: int = 0  # gone from Kafka (reference mode)
    notified: int = 0
    lateness_ms: tuple[int, ...] = ()  # per published row: publish time - due time
    died: int = 0  # expired, with no destination topic, or corrupt


class Scheduler:
    """Republish due stored retries until stop() or SIGTERM (run), or one pass at a time.

    on_dead: hooks called once per record that died (see `redrive.store.notify`); webhook: a URL
        that receives each as a JSON POST.
    lease_s: how long a row stays in flight, its copy unreported, before it is republished.
        A row claimed by a scheduler that died before dispatching it comes back sooner: after
        `claim_s`, a minute (twice timeout_s if longer) or the lease if shorter.
    """

    def __init__(self, store: RetryStore, connection: kafka.Connection, *,
                 batch_size: int = DEFAULT_BATCH, idle_s: float = DEFAULT_IDLE_S,
                 on_dead: Sequence[DeadHook] = (), webhook: str | None = None,
                 producer_config: Mapping[str, Any] | None = None,
                 metrics: Metrics | None = None, timeout_s: float = 30.0,
                 lease_s: float = DEFAULT_LEASE_S) -> None:
        if not isinstance(store, RetryStore):
            raise InvalidArgument("store", store, "must be a RetryStore")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgument("batch_size", batch_size, "must be an integer >= 1")
        check_positive("idle_s", idle_s)
        check_positive("lease_s", lease_s)
        check_positive("timeout_s", timeout_s)
        check_optional("metrics", metrics, Metrics, "a redrive.metrics.Metrics")
        check_text("webhook", webhook)
        if isinstance(on_dead, str | bytes) or not isinstance(on_dead, Sequence):
            raise InvalidArgument("on_dead", on_dead, "must be a list of hooks, each callable "
                                  "with a StoredRetry")
        self.store = store
        self.batch_size = batch_size
        self.idle_s = float(idle_s)
        self.timeout_s = timeout_s
        self.lease_s = float(lease_s)
        self.claim_s = min(self.lease_s, max(CLAIM_S, 2 * timeout_s))
        self.metrics = metrics if metrics is not None else Metrics("scheduler", "store")
        hooks: list[DeadHook] = list(on_dead)
        if webhook:
            # One call (the whole of it: see store.webhook) must end well within the claim, or
            # its row is notified twice.
            hooks.append(Webhook(webhook, timeout_s=min(10.0, self.claim_s / 4)))
        self.notifier = Notifier(hooks, metrics=self.metrics)
        # Its checks go through its producer, so they ask about no topic (see BrokerHealth).
        self.health = BrokerHealth("store scheduler", self.metrics)
        self._connection = self.health.watch(kafka.client_config(connection))
        self._producer_config = check_settings("producer_config", producer_config)
        self._producer: Producer | None = None
        self._reader: Consumer | None = None
        self._admin: kafka.Admin | None = None
        self._partitions: dict[str, int] = {}
        self._unsettled: DueBatch | None = None  # a whole pass's marks, left to the next claim
        self._refusals = Refusals()  # by row id
        self._stopping = threading.Event()

    # --- one pass ------------------------------------------------------------------------------

    def run_once(self) -> Pass:
        """Publish what is due now (up to batch_size rows) and deliver pending notifications."""
        published, expired, died, lateness = 0, 0, 0, list[int]()
        at = now_ms()
        # After a pass that took a whole batch more are likely due, and its marks need a writing
        # transaction anyway: the claim goes first, without asking.
        asked = self._unsettled is None
        if asked:
            oldest = self.store.oldest_pending_due_ms()
            self._overdue(oldest)
        # Otherwise rows are claimed in a writing transaction only when some are due: on SQLite
        # it takes the database's one write lock, which the runtimes' batches would wait for.
        if not asked or (oldest is not None and oldest <= at):
            with self.store.take_due(self.batch_size, settling=self._unsettled) as batch:
                self._unsettled = None
                if not asked:
                    # Claimed earliest due first: the first row is the most overdue.
                    self._overdue(batch.rows[0].due_ms if batch.rows else None)
                published, expired, lateness = self._dispatch(batch)
                died = len(batch.dead_ids)
                # The marks are written by this scheduler, and kept until they are: a settle
                # that fails (the database away for a moment) must not leave published rows
                # to pass for a dead scheduler's claims.
                batch.defer()
                self._unsettled = batch
            if batch.taken < self.batch_size:
                # Fewer than a whole batch: written now. (A whole batch's marks go with the
                # next pass's claim, which follows at once: one commit a pass instead of two.
                # Should this process die first, the rows come back after their claim.)
                self._settle()
        else:
            self._settle()
        notified = self.notifier.deliver(self.store, self.claim_s)
        return Pass(published, expired, notified, tuple(lateness), died)

    def _overdue(self, oldest_due_ms: int | None) -> None:
        """The most overdue retry has waited since its due time (its gauge reads 0 until then,
        and when none waits)."""
        self.metrics.oldest_pending_retry_since(oldest_due_ms)

    def _settle(self) -> None:
        if self._unsettled is not None:
            self.store.settle(self._unsettled)
            self._unsettled = None

    def reclaim(self) -> int:
        """Make pending again the rows whose lease ran out (see the module's doc); return how
        many."""
        # This scheduler's own deferred marks first: its rows, published, would otherwise pass
        # for a dead scheduler's claims once the claim time ran out (a database away that long).
        self._settle()
        self.store.release_notification_claims(round(self.claim_s * 1000))
        reclaimed = self.store.reclaim_expired(round(self.lease_s * 1000),
                                               round(self.claim_s * 1000))
        if reclaimed:
            log.warning("%d stored retr%s in flight for over %gs without being handled: "
                        "republishing", reclaimed, "y" if reclaimed == 1 else "ies", self.lease_s)
            self.metrics.reclaimed(reclaimed)
        return reclaimed

    def _dispatch(self, batch: DueBatch) -> tuple[int, int, list[int]]:
        for corrupt in batch.corrupt:
            # Its copy cannot be built as it was; taken again, it would fail every pass.
            log.error("%s: it dies as %r", corrupt, CORRUPT)
            batch.mark_dead([corrupt.row], CORRUPT, str(corrupt), now_ms())
            self.metrics.dead_lettered(corrupt.row.topic, CORRUPT)
        if not batch.rows:
            return 0, 0, []
        out: list[tuple[StoredRetry, kafka.OutRecord]] = []
        gone: list[StoredRetry] = []
        nowhere: list[tuple[StoredRetry, str]] = []
        unreadable: dict[tuple[str, int], RangeReadFailed] = {}
        for row in batch.rows:
            try:
                failed = unreadable.get((row.topic, row.partition))
                if failed is not None:
                    raise failed  # tried once a pass: each try may wait timeout_s
                record = self._record(row)
            except UnknownTopic as exc:
                # Failing the pass would take the same rows first again, and block every group.
                nowhere.append((row, exc.topic))
                continue
            except RangeReadFailed as exc:
                # A reference whose partition cannot be read now (a topic the scheduler may not
                # read, a read stuck): held like a refused copy, for the same reason.
                unreadable[(row.topic, row.partition)] = exc
                self._hold_refused(batch, row, exc, now_ms())
                continue
            if record is None:
                gone.append(row)
            else:
                out.append((row, record))
        at = now_ms()
        batch.mark_dead(gone, EXPIRED, "the record is no longer in Kafka (retention or "
                        "compaction removed it) so it cannot be retried", at)
        for row, topic in nowhere:
            why = (f"its destination topic {topic!r} does not exist" if topic == row.destination
                   else f"its original topic {topic!r} does not exist (or has no partition "
                   f"{row.partition})")
            batch.mark_dead([row], NO_DESTINATION, why, at)
        for row, reason in [*((r, EXPIRED) for r in gone),
                            *((r, NO_DESTINATION) for r, _ in nowhere)]:
            self.metrics.dead_lettered(row.topic, reason)
        if out:
            try:
                outcomes = kafka.produce_each(self._require_producer(), [o for _, o in out],
                                              self.timeout_s, shrink=slimmed)
            except (KafkaException, RedriveError) as exc:
                # What the producer still holds is this pass's rows, pending again when the
                # pass fails: sent later, they would only be duplicates of the next pass's.
                discard_producer(self._producer)
                self._producer = None
                if producer_failed(exc):
                    log.warning("the producer failed for good; the next pass makes a new one")
                raise
            self.health.ok()
            at = now_ms()
            for (row, _), refused in zip(out, outcomes, strict=True):
                if refused is not None:
                    self._hold_refused(batch, row, refused, at)
            if self._refusals:
                out = [pair for pair, refused in zip(out, outcomes, strict=True)
                       if refused is None]
                self._refusals.forget(row.id for row, _ in out)
            batch.mark_in_flight((row.id for row, _ in out), at)
        lateness = [at - row.due_ms for row, _ in out]
        for (_, record), late in zip(out, lateness, strict=True):
            self.metrics.forwarded(record.topic)
            self.metrics.late_by(late / 1000.0)
        return len(out), len(gone), lateness

    def _hold_refused(self, batch: DueBatch, row: StoredRetry, why: RedriveError,
                      at: int) -> None:
        """A copy the broker refused (larger than its topic takes, a topic the scheduler may not
        write), or a reference that could not be read back, would fail again at once: its row
        waits 1 s, doubling to a minute while the failures go on, and the other rows go on
        meanwhile (failing the pass would take this row first again, and block every group)."""
        pause_s = self._refusals.pause_s(row.id)
        batch.mark_held(row.id, at + round(pause_s * 1000))
        log.warning("stored retry %d of group %s on %s: %s; its copy is tried again in %g s",
                    row.id, row.group, row.topic, why, pause_s)

    def _record(self, row: StoredRetry) -> kafka.OutRecord | None:
        if row.mode == PAYLOAD:
            key, value, headers = row.key, row.value, row.headers
        else:
            found = self._read_back(row)
            if found is None:
                return None
            key, value, headers = found
        destination = row.destination
        partitions = self._partition_count(destination)
        # The copy is stamped now, not with the original's time (kept in its headers): a copy of
        # a record older than the destination's retention would otherwise be deleted on arrival.
        return kafka.OutRecord(destination, value, key, h.replace(headers, _fields(row)),
                               partition_for(row.partition, partitions))

    def _read_back(self, row: StoredRetry) -> tuple[bytes | None, bytes | None,
                                                    list[tuple[str, bytes | None]]] | None:
        """The record at the row's original offset, or None if Kafka no longer has it (gone by
        retention, or compacted or aborted: then no record fills the offset). Raises
        RangeReadFailed when it cannot be read in time."""
        reader = self._require_reader()
        try:
            low, high = kafka.watermarks(reader, row.topic, row.partition, self.timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in _UNKNOWN_CODES and row.partition >= self._fresh_partition_count(row.topic):
                # The original topic (or this partition of it) is gone: the record with it.
                raise UnknownTopic(row.topic) from exc
            # Any other failure to ask (a partition without a leader, a timeout) is held per
            # partition like a stuck read: failing the pass would block every group.
            raise RangeReadFailed(row.topic, row.partition, row.offset, row.offset + 1,
                                  f"its watermarks could not be read: {exc}") from exc
        if not low <= row.offset < high:
            return None
        wanted = PartitionRange(row.topic, row.partition, row.offset, row.offset + 1)
        for chunk in RangeReader(reader, [wanted], idle_s=self.timeout_s,
                                 skip_lost=True).chunks():
            message = chunk.messages[0]
            return message.key(), message.value(), kafka.message_headers(message)
        return None

    def _fresh_partition_count(self, topic: str) -> int:
        """The topic's partition count from metadata asked now; 0 when it does not exist."""
        self._partitions = kafka.topic_partitions(self._require_admin())
        return self._partitions.get(topic, 0)

    def _partition_count(self, topic: str) -> int:
        if topic not in self._partitions:
            self._partitions = kafka.topic_partitions(self._require_admin())
            if topic not in self._partitions:
                raise UnknownTopic(topic)
        return self._partitions[topic]

    # --- running -------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect now (run() does it): the producer's first records would otherwise wait for
        its idempotence handshake and the cluster's metadata, late past their due time."""
        self._require_producer()
        self._partitions = kafka.topic_partitions(self._require_admin())

    def run(self) -> None:
        """Pass after pass until stop() or SIGTERM/SIGINT (in the main thread), then close.

        A pass that fails (database or broker unreachable) is tried again after a pause that
        grows with each failure in a row; an outage is logged when it starts and when it ends.
        Nothing a failed pass took is lost, since its rows stay pending.
        """
        sweep_at = time.monotonic() + ORPHAN_SWEEP_S
        # Checked a few times per claim, so a row comes back soon after its claim or lease runs
        # out.
        reclaim_every_s = min(ORPHAN_SWEEP_S, self.claim_s / 4)
        reclaim_at = time.monotonic()
        failures = 0  # passes failed in a row
        self.start()
        try:
            with stop_on_signals(self.stop):
                while not self._stopping.is_set():
                    try:
                        if time.monotonic() >= reclaim_at:
                            self.reclaim()
                            reclaim_at = time.monotonic() + reclaim_every_s
                        done = self.run_once()
                        if time.monotonic() >= sweep_at:
                            self.store.release_orphans()
                            sweep_at = time.monotonic() + ORPHAN_SWEEP_S
                    except (RedriveError, KafkaException) as exc:
                        pause = min(MAX_ERROR_PAUSE_S, ERROR_PAUSE_S * 2 ** min(failures, 16))
                        failures += 1
                        # A broker outage is logged by the health; anything else once per run
                        # of failures.
                        if not self.health.failed(exc):
                            (log.error if failures == 1 else log.debug)(
                                "scheduler pass failed (%s); trying again in %.1fs, and at "
                                "growing intervals while it keeps failing", exc, pause)
                        self._stopping.wait(pause)
                        continue
                    if failures:
                        log.warning("scheduler passes succeed again after %d failed", failures)
                        failures = 0
                    self.health.tick(self._require_producer())
                    if done.published + done.died < self.batch_size:
                        self._stopping.wait(self.idle_s)
        finally:
            self.close()

    def stop(self) -> None:
        """Ask run() to stop after the pass in hand; safe from any thread or signal handler."""
        self._stopping.set()

    def close(self) -> None:
        self._stopping.set()
        try:
            self._settle()
        except StoreUnavailable as exc:
            log.warning("the last pass's rows stay claimed until their claim runs out (%s)", exc)
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _require_admin(self) -> kafka.Admin:
        if self._admin is None:
            self._admin = kafka.admin(self._connection)
        return self._admin

    def _require_producer(self) -> Producer:
        if self._producer is None:
            self._producer = kafka.producer(self._connection, overrides=self._producer_config)
        return self._producer

    def _require_reader(self) -> Consumer:
        if self._reader is None:
            self._reader = range_consumer(self._connection, READER_OVERRIDES)
        return self._reader


def _fields(row: StoredRetry) -> dict[str, str | int | None]:
    """redrive's headers for a republished row: its whole history, and who retries it."""
    return {
        h.ATTEMPT: row.attempt,
        h.DUE: row.due_ms,
        h.GROUP: row.group,
        h.FIRST_FAILURE: row.first_failure_ms,
        **h.origin_fields(Origin(row.topic, row.partition, row.offset, row.timestamp_ms)),
        h.ERROR_TYPE: row.error_type,
        h.ERROR_MESSAGE: row.error_message,
        h.ERROR_TRACE: row.error_trace,
        h.REASON: None,
        h.TARGET: None,
    }
