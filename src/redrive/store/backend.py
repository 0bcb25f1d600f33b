"""The store as a retry backend: failed records are kept in a RetryStore, not in retry topics.

The store's scheduler republishes each when due to the topic the group reads (the original topic,
or a configured inbox), and the runtime reports how it went (see redrive.backends for the protocol).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from redrive import headers as h
from redrive import kafka, topics
from redrive.backends import BoundBackend, RetryBackend, Verdict
from redrive.clock import now_ms
from redrive.errors import InvalidArgument
from redrive.policy import RetryPolicy
from redrive.record import Origin, Record
from redrive.routing import DeadLetter, Retry, Route
from redrive.store.rows import Coordinates, Entry, RecordState, Success, stored_headers
from redrive.store.schema import DEAD, IN_FLIGHT, MODES, PARKED, PAYLOAD, PENDING, REFERENCE
from redrive.store.store import RetryStore


@dataclass(frozen=True)
class StoreBackend(RetryBackend):
    """Failed records are kept in `store` until due; its scheduler republishes them.

    mode: "payload" keeps value and headers in the store; "reference" keeps only where the
        record is, and the scheduler reads it back from Kafka when due.
    inbox: the topic the scheduler republishes to for this group (the runtime reads it too);
        by default each record goes back to its original topic, marked with `redrive-group`.
    ordering: while a key has a record waiting in the store, later records with that key wait
        behind it (parked in the store) and are released one by one, in order.
    policies: a policy per main topic, instead of the runtime's own, for routing failures.
    """

    store: RetryStore
    mode: str = PAYLOAD
    inbox: str | None = None
    ordering: bool = False
    policies: Mapping[str, RetryPolicy] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.store, RetryStore):
            raise InvalidArgument("store", self.store, "must be a RetryStore")
        if self.mode not in MODES:
            raise InvalidArgument("mode", self.mode, f"expected one of {MODES}")
        if self.inbox is not None:
            topics.check_name("inbox", self.inbox)
        for topic, policy in (self.policies or {}).items():
            if not isinstance(policy, RetryPolicy):
                raise InvalidArgument(f"policies[{topic!r}]", policy, "must be a RetryPolicy")

    def bind(self, group: str) -> BoundBackend:
        return _StoreBound(self, group)


class _StoreBound(BoundBackend):
    # Store writes are not part of Kafka transactions, so they cannot be exactly-once with them.
    transactions_supported = False

    def __init__(self, backend: StoreBackend, group: str) -> None:
        self.backend = backend
        self.store = backend.store
        self.group = group
        self.sequential = backend.ordering
        self._entries: list[Entry] = []
        self._successes: list[Success] = []
        self._seen: set[Coordinates] = set()  # origins with an outcome in this batch
        self._waiting_keys: set[tuple[str, bytes]] = set()
        # What prefetch read for this batch: a row (None: absent) per dispatched origin, and
        # whether each (topic, key) is active. Anything else is asked of the store in admit.
        self._rows: dict[Coordinates, RecordState | None] = {}
        self._keys_active: dict[tuple[str, bytes], bool] = {}

    def consumed_topics(self, plan: topics.TopicPlan) -> list[str]:
        inbox = self.backend.inbox
        return [plan.topic] if inbox is None or inbox == plan.topic else [plan.topic, inbox]

    def prepare(self, admin: AdminClient, plans: Mapping[str, topics.TopicPlan]) -> list[str]:
        inbox = self.backend.inbox
        if inbox is not None:
            counts = kafka.topic_partitions(admin)
            if inbox not in counts:
                needed = max((counts.get(topic, 1) for topic in plans), default=1)
                kafka.create_topics(admin, {inbox: needed})
        return []

    def waits(self, plans: Mapping[str, topics.TopicPlan]) -> dict[str, int]:
        if self.backend.mode != REFERENCE:
            return {}
        # A reference is read back from the main topic at every retry: the original waits
        # there until the last one is due.
        waits: dict[str, int] = {}
        for topic, plan in plans.items():
            own = (self.backend.policies or {}).get(topic)
            routed = topics.plan(own, topic, self.group) if own is not None else plan
            waits[topic] = sum(retry.wait_ms * len(retry.retries)
                               for retry in routed.retry_topics)
        return waits

    def policy_for(self, topic: str, default: RetryPolicy) -> RetryPolicy:
        return (self.backend.policies or {}).get(topic, default)

    def _dispatched(self, record: Record) -> bool:
        # A copy read from a retry topic (an earlier policy's) has no row: it is handled anew.
        return (record.delivery.group == self.group and record.delivery.original is not None
                and topics.retried_topic(record.topic, self.group) is None)

    def prefetch(self, records: Sequence[Record]) -> None:
        origins: list[Coordinates] = []
        keys: list[tuple[str, bytes]] = []
        for record in records:
            origin = record.origin()
            if self._dispatched(record):
                origins.append((origin.topic, origin.partition, origin.offset))
            elif self.backend.ordering and record.key is not None:
                keys.append((origin.topic, record.key))
        found = self.store.record_states(self.group, origins)
        self._rows = {coordinates: found.get(coordinates) for coordinates in origins}
        active = self.store.active_keys(self.group, keys)
        self._keys_active = {key: key in active for key in keys}

    def admit(self, record: Record) -> Verdict:
        origin = record.origin()
        if (origin.topic, origin.partition, origin.offset) in self._seen:
            return Verdict.DUPLICATE
        if self._dispatched(record):
            row = self._row(origin)
            # A second copy (a scheduler crashed between publishing and marking) or one the
            # row has moved past (handled, re-failed, cancelled, purged) is not handled again.
            if row is None or row.status not in (PENDING, IN_FLIGHT) \
                    or row.attempt != record.delivery.attempt:
                return Verdict.DUPLICATE
            return Verdict.PROCESS
        if self.backend.ordering and record.key is not None and (
                (origin.topic, record.key) in self._waiting_keys
                or self._key_active(origin.topic, record.key)):
            self._stage(self._entry(record, origin, PARKED, record.headers, attempt=0,
                                    due_ms=now_ms()))
            return Verdict.PARKED
        return Verdict.PROCESS

    def _row(self, origin: Origin) -> RecordState | None:
        coordinates = (origin.topic, origin.partition, origin.offset)
        if coordinates in self._rows:
            return self._rows[coordinates]
        return self.store.record_states(self.group, [coordinates]).get(coordinates)

    def _key_active(self, topic: str, key: bytes) -> bool:
        known = self._keys_active.get((topic, key))
        return self.store.key_active(self.group, topic, key) if known is None else known

    def succeeded(self, record: Record) -> None:
        if not self._dispatched(record):
            return
        origin = record.origin()
        self._seen.add((origin.topic, origin.partition, origin.offset))
        self._successes.append(Success(self.group, origin.topic, origin.partition,
                                       origin.offset, record.delivery.attempt,
                                       record.key if self.backend.ordering else None))

    def failed(self, record: Record, decision: Route,
               partitions: Mapping[str, int]) -> kafka.OutRecord | None:
        origin = record.origin()
        fields = decision.headers
        first = h.last(fields, h.FIRST_FAILURE)
        entry = self._entry(
            record, origin, PENDING if isinstance(decision, Retry) else DEAD, fields,
            attempt=decision.attempt,
            due_ms=decision.due_ms if isinstance(decision, Retry) else now_ms(),
            first_failure_ms=int(first) if first is not None else None,
            reason=decision.reason if isinstance(decision, DeadLetter) else None,
            error_type=_text(fields, h.ERROR_TYPE), error_message=_text(fields, h.ERROR_MESSAGE),
            error_trace=_text(fields, h.ERROR_TRACE))
        self._stage(entry)
        return None

    def _entry(self, record: Record, origin: Origin, status: str,
               headers: Sequence[tuple[str, bytes | None]], *, attempt: int, due_ms: int,
               first_failure_ms: int | None = None, reason: str | None = None,
               error_type: str | None = None, error_message: str | None = None,
               error_trace: str | None = None) -> Entry:
        # Payload mode keeps the headers as routing wrote them (or as consumed, for a parked
        # record) but redrive's own, which the scheduler writes from the row when it
        # republishes.
        payload = self.backend.mode == PAYLOAD
        timestamp = origin.timestamp_ms if origin.timestamp_ms is not None \
            and origin.timestamp_ms >= 0 else None
        return Entry(group=self.group, topic=origin.topic, partition=origin.partition,
                     offset=origin.offset, timestamp_ms=timestamp, key=record.key,
                     mode=self.backend.mode, value=record.value if payload else None,
                     headers=stored_headers(headers) if payload else None,
                     target=self.backend.inbox,
                     attempt=attempt, first_failure_ms=first_failure_ms, due_ms=due_ms,
                     status=status, reason=reason, error_type=error_type,
                     error_message=error_message, error_trace=error_trace,
                     ordered=self.backend.ordering)

    def _stage(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._seen.add((entry.topic, entry.partition, entry.offset))
        if entry.status != DEAD and entry.key is not None:
            self._waiting_keys.add((entry.topic, entry.key))

    def flush(self) -> None:
        try:
            if self._entries or self._successes:
                self.store.write(self._entries, self._successes)
        finally:
            self.discard()

    def discard(self) -> None:
        self._entries = []
        self._successes = []
        self._seen = set()
        self._waiting_keys = set()
        self._rows = {}
        self._keys_active = {}


def _text(headers: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    raw = h.last(headers, name)
    return None if raw is None else raw.decode("utf-8", errors="replace")
