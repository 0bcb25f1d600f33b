"""Prometheus metrics shared by every runtime (consumer, delay service, Spark pipeline, scheduler).

Each runtime owns one `Metrics`, labelled with the runtime kind and its group, in a registry of its
own by default so that several runtimes in one process (tests, notebooks) never collide; pass
`registry=prometheus_client.REGISTRY` to join the process-wide one.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate
from threading import Lock
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily, Sample
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .clock import now_ms

# The `why` label of records skipped because another group failed them, in every runtime.
SKIPPED_OTHER_GROUP = "other-group"

_LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_HANDLER_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30)
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# prometheus_client keeps its switch for `_created` samples (PROMETHEUS_DISABLE_CREATED_SERIES,
# disable_created_metrics()) private: one of its own metrics tells whether it is on.
_CREATED_PROBE = Counter("redrive_created_probe", "", registry=None)


def _created_samples_on() -> bool:
    return any(sample.name.endswith("_created")
               for family in _CREATED_PROBE.collect() for sample in family.samples)


class _Histogram(Collector):
    """A histogram exposed as prometheus_client's Histogram would expose it, kept by hand because
    prometheus_client has no bulk update: `observe_all` counts a batch under one lock.

    A Metrics has one runtime and group, hence one label set per histogram. Like a Histogram
    child, the series appears, with its `_created` time, at the first observation. Values are
    never NaN (which Histogram would leave out of every bucket).
    """

    def __init__(self, name: str, documentation: str, labels: dict[str, str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._bounds = (*map(float, buckets), math.inf)
        # Histogram's own `le` formatting, unannotated in prometheus_client.
        self._les = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._lock = Lock()  # observed on a runtime's thread, collected on the HTTP server's
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created: float | None = None
        registry.register(self)

    def observe(self, value: float) -> None:
        # The first bucket whose bound is >= value, as Histogram.observe picks it.
        index = bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value
            if self._created is None:
                self._created = time.time()

    def observe_all(self, values: Sequence[float]) -> None:
        """observe(value) for each of `values`, leaving the very same counts and sum. At least
        one value: this starts the series, as an observation does."""
        bounds, counts = self._bounds, self._counts
        with self._lock:
            total = self._sum
            for value in values:
                counts[bisect_left(bounds, value)] += 1
                total += value
            self._sum = total
            if self._created is None:
                self._created = time.time()

    def describe(self) -> Iterator[HistogramMetricFamily]:
        # Reserves the histogram's sample names in the registry, as a Histogram does.
        yield HistogramMetricFamily(self._name, self._documentation, labels=list(self._labels))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=list(self._labels))
        with self._lock:
            counts, total, created = list(self._counts), self._sum, self._created
        if created is not None:
            cumulative = map(float, accumulate(counts))  # floats, as Histogram's samples are
            family.add_metric(list(self._labels.values()),
                              list(zip(self._les, cumulative, strict=True)), total)
            # HistogramMetricFamily takes no creation time (CounterMetricFamily does).
            if _created_samples_on():
                family.samples.append(Sample(f"{self._name}_created", dict(self._labels), created))
        yield family


class Metrics:
    def __init__(self, runtime: str, group: str,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.runtime = runtime
        self.group = group
        base = ["runtime", "group"]
        self._processed = Counter("redrive_processed", "Records handled successfully",
                                  [*base, "topic"], registry=self.registry)
        self._retried = Counter("redrive_retried", "Records sent to a retry topic",
                                [*base, "topic", "attempt"], registry=self.registry)
        self._dead = Counter("redrive_dead_lettered", "Records sent to the dead-letter topic",
                             [*base, "topic", "reason"], registry=self.registry)
        self._skipped = Counter("redrive_skipped", "Records skipped (e.g. meant for another group)",
                                [*base, "topic", "why"], registry=self.registry)
        self._replayed = Counter("redrive_replayed", "Dead-letter records replayed",
                                 [*base, "topic"], registry=self.registry)
        self._forwarded = Counter("redrive_forwarded", "Delayed records forwarded when due",
                                  [*base, "topic"], registry=self.registry)
        self._in_place = Counter("redrive_in_place_retries", "Retries done in place (blocking)",
                                 [*base, "topic"], registry=self.registry)
        self._rebalances = Counter("redrive_rebalances", "Partition assignments and revocations",
                                   [*base, "kind"], registry=self.registry)
        self._lateness = _Histogram("redrive_lateness_seconds",
                                    "How long after its due time a record was processed",
                                    self._labels(), _LATENESS_BUCKETS, self.registry)
        self._handler = _Histogram("redrive_handler_seconds", "Time spent in the user's handler",
                                   self._labels(), _HANDLER_BUCKETS, self.registry)
        self._steps = Histogram("redrive_batch_step_seconds",
                                "Wall time of each step of a Spark pipeline's micro-batch",
                                [*base, "step"], buckets=_STEP_BUCKETS, registry=self.registry)
        self._paused = Gauge("redrive_paused_partitions", "Partitions paused until a record is due",
                             base, registry=self.registry)
        self._braked = Gauge("redrive_braked_partitions",
                             "Partitions stopped by the dead-letter brake until resumed", base,
                             registry=self.registry)
        self._brake_trips = Counter("redrive_brake_trips",
                                    "Times the dead-letter brake stopped a partition",
                                    [*base, "topic"], registry=self.registry)
        self._reclaimed = Counter("redrive_reclaimed",
                                  "Stored retries republished after their lease ran out",
                                  base, registry=self.registry)
        self._given_up = Counter("redrive_notifications_given_up",
                                 "Dead records whose notification was given up after failing "
                                 "while others went through: their receivers never saw them",
                                 base, registry=self.registry)
        self._broker_up = Gauge("redrive_broker_up",
                                "1 while the runtime reaches its brokers, 0 during an outage",
                                base, registry=self.registry)
        self._lost = Counter("redrive_lost_offsets",
                             "Offsets of retry or delay topics deleted before the group read "
                             "them (retention): at most this many records lost",
                             [*base, "topic"], registry=self.registry)
        self._oldest = Gauge("redrive_oldest_pending_retry_seconds",
                             "Age of the oldest retry waiting to become due", base,
                             registry=self.registry)

        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._oldest_since_ms: int | None = None
        self._oldest_bound = False

    def _labels(self) -> dict[str, str]:
        return {"runtime": self.runtime, "group": self.group}

    def _child(self, metric: Any, *values: str) -> Any:
        # Resolving labels costs more than the increment: runtimes count per record.
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.runtime, self.group, *values)
        return child

    def processed(self, topic: str, count: int = 1) -> None:
        self._child(self._processed, topic).inc(count)

    def retried(self, topic: str, attempt: int, count: int = 1) -> None:
        self._child(self._retried, topic, str(attempt)).inc(count)

    def dead_lettered(self, topic: str, reason: str, count: int = 1) -> None:
        self._child(self._dead, topic, reason).inc(count)

    def skipped(self, topic: str, why: str, count: int = 1) -> None:
        self._child(self._skipped, topic, why).inc(count)

    def replayed(self, topic: str, count: int = 1) -> None:
        self._child(self._replayed, topic).inc(count)

    def forwarded(self, topic: str, count: int = 1) -> None:
        self._child(self._forwarded, topic).inc(count)

    def reclaimed(self, count: int) -> None:
        self._reclaimed.labels(self.runtime, self.group).inc(count)

    def notification_given_up(self, count: int = 1) -> None:
        self._given_up.labels(self.runtime, self.group).inc(count)

    def lost(self, topic: str, count: int) -> None:
        self._child(self._lost, topic).inc(count)

    def retried_in_place(self, topic: str, count: int = 1) -> None:
        self._child(self._in_place, topic).inc(count)

    def rebalanced(self, kind: str) -> None:
        self._child(self._rebalances, kind).inc()

    def late_by(self, seconds: float) -> None:
        self._lateness.observe(max(0.0, seconds))

    def late_by_all(self, samples: Sequence[float]) -> None:
        """late_by(seconds) for each of `samples`, under one lock (a poll batch's retries)."""
        if samples:
            self._lateness.observe_all([max(0.0, seconds) for seconds in samples])

    def handler_took(self, seconds: float) -> None:
        self._handler.observe(seconds)

    def handler_took_all(self, samples: Sequence[float]) -> None:
        """handler_took(seconds) for each of `samples` (handler times), at once.

        One lock for the batch instead of one per sample: a consumer times a sample of its
        records and reports a poll batch's worth of them at a time.
        """
        if samples:  # most poll batches: no record in them was timed
            self._handler.observe_all(samples)

    def batch_step_took(self, step: str, seconds: float) -> None:
        self._child(self._steps, step).observe(seconds)

    def paused_partitions(self, count: int) -> None:
        self._child(self._paused).set(count)

    def braked_partitions(self, count: int) -> None:
        self._child(self._braked).set(count)

    def brake_tripped(self, topic: str) -> None:
        self._child(self._brake_trips, topic).inc()

    def broker_up(self, up: bool) -> None:
        self._child(self._broker_up).set(1 if up else 0)

    def oldest_pending_retry_since(self, since_ms: int | None) -> None:
        """The oldest pending retry has waited since `since_ms` (None: none waits). Its age is
        worked out when the gauge is read: a runtime updates it when its holds change, and a
        scrape in between must still see the age grow."""
        self._oldest_since_ms = since_ms
        if not self._oldest_bound:
            self._child(self._oldest).set_function(self._oldest_age_s)
            self._oldest_bound = True

    def _oldest_age_s(self) -> float:
        since = self._oldest_since_ms
        return 0.0 if since is None else max(0, now_ms() - since) / 1000

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 if never set): for tests and summaries."""
        sample = self.registry.get_sample_value(name, {**self._labels(), **labels})
        return 0.0 if sample is None else float(sample)

    def total(self, name: str) -> float:
        """Sum of a counter's samples over all label values of this runtime and group."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in self._labels().items()):
                    total += sample.value
        return total

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose the metrics on http://addr:port/metrics (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
