"""Where a RetryingConsumer's failed records go: the route of each, under its main topic's policy.

A record failing for the first time takes `FirstFailures`, made anew for each poll batch, so that
a batch's distinct errors are classified and their headers built once; anything else (a retry
copy, unreadable headers, an error `FirstFailures` leaves alone) takes `routing.route`. Each
record is routed at the moment it failed, however long the rest of its batch took.
"""

from __future__ import annotations

from redrive.backends import BoundBackend
from redrive.clock import now_ms
from redrive.first_failures import FirstFailures
from redrive.policy import RetryPolicy
from redrive.record import NO_HISTORY, Delivery, ErrorInfo, Record
from redrive.routing import Route, route


class Routes:
    def __init__(self, backend: BoundBackend, policy: RetryPolicy, group: str) -> None:
        self._backend = backend
        self._policy = policy
        self._group = group
        self._first: dict[str, FirstFailures] = {}  # by main topic, for the batch in hand

    def new_batch(self) -> None:
        self._first = {}

    def route(self, record: Record, error: BaseException | ErrorInfo, main: str,
              delivery: Delivery | None) -> Route:
        """The route of `record`, read from `main`'s topics; `delivery` as `routing.route`
        takes it (None: its headers are read again)."""
        policy = self._backend.policy_for(main, self._policy)
        at = now_ms()
        if delivery is NO_HISTORY and isinstance(error, ErrorInfo):
            first = self._first.get(main)
            if first is None:
                first = self._first[main] = FirstFailures(policy, self._group, at)
            decision = first.route(record.topic, record.partition, record.offset,
                                   record.timestamp_ms, record.headers, error, at)
            if decision is not None:
                return decision
        return route(record, error, policy, at, group=self._group, delivery=delivery)
