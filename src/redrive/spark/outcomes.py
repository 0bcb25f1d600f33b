"""What a RetryPipeline did with its records: each batch's report, and the running totals."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
RETRY, DEAD_LETTER = "retry", "dead-letter"
# Handler time and lateness are observed on at most this many records per batch: enough for
# quantiles.
SAMPLE = 2_000


@dataclass
class PipelineStats:
    batches: int = 0
    records: int = 0
    succeeded_by_retries: Counter[int] = field(default_factory=Counter)  # retries before success
    retried_by_attempt: Counter[int] = field(default_factory=Counter)
    dead_lettered_by_reason: Counter[str] = field(default_factory=Counter)
    dropped_by_reason: Counter[str] = field(default_factory=Counter)  # no dead-letter topic
    skipped: int = 0  # meant for another group
    early: int = 0  # handled before their due time: must stay 0
    in_place_retries: int = 0
    # Seconds the batches' bodies spent in each step (see BatchReport.steps), summed.
    step_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def succeeded(self) -> int:
        return sum(self.succeeded_by_retries.values())

    @property
    def dead_lettered(self) -> int:
        return sum(self.dead_lettered_by_reason.values())

    @property
    def retried(self) -> int:
        return sum(self.retried_by_attempt.values())

    @property
    def finished(self) -> int:
        """Records that reached an end: succeeded, dead-lettered or dropped by policy."""
        return self.succeeded + self.dead_lettered + sum(self.dropped_by_reason.values())

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        for step, seconds in report.steps:
            self.step_seconds[step] = self.step_seconds.get(step, 0.0) + seconds
        for row in report.outcomes:
            self.records += row.n
            self.early += row.early
            self.in_place_retries += row.in_place
            if row.status == OK:
                self.succeeded_by_retries[row.attempt] += row.n
            elif row.status == SKIPPED:
                self.skipped += row.n
        for route in report.routes:
            if route.kind == RETRY:
                self.retried_by_attempt[route.attempt] += route.n
            elif route.topic is None:
                self.dropped_by_reason[route.reason or ""] += route.n
            else:
                self.dead_lettered_by_reason[route.reason or ""] += route.n


class Outcomes(NamedTuple):
    """How many records of a batch had one status, attempt, topic and skip reason."""

    status: str
    attempt: int
    topic: str
    skip_reason: str | None
    n: int
    early: int = 0  # of them, handled before their due time
    in_place: int = 0  # in-place retries they took


class Routed(NamedTuple):
    """How many failed records went one way: a retry topic, the dead-letter topic, or nowhere
    (`topic` None: the policy has no dead-letter topic)."""

    kind: str  # RETRY or DEAD_LETTER
    reason: str | None  # the dead-letter reason; None for a retry
    attempt: int
    topic: str | None
    n: int
    source_topic: str = ""  # the topic the failed records were read from
    source_attempt: int = -1  # the attempt they were on; -1 where their headers are unreadable


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, as the batch's body reports it to the pipeline's client."""

    batch: int
    outcomes: tuple[Outcomes, ...] = ()
    routes: tuple[Routed, ...] = ()
    handler_us: tuple[int, ...] = ()  # a sample of handler times
    late_s: tuple[float, ...] = ()  # a sample of lateness past due
    # Wall seconds of each step of the body, in order: where a batch's time goes. The steps are
    # Spark jobs (calls to the server on Spark Connect) or round trips to the brokers.
    steps: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "outcomes": [list(o) for o in self.outcomes],
                "routes": [list(r) for r in self.routes], "handler_us": list(self.handler_us),
                "late_s": list(self.late_s), "steps": [list(s) for s in self.steps]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchReport:
        return cls(int(data["batch"]), tuple(Outcomes(*o) for o in data.get("outcomes", ())),
                   tuple(Routed(*r) for r in data.get("routes", ())),
                   tuple(data.get("handler_us", ())), tuple(data.get("late_s", ())),
                   tuple((str(step), float(seconds)) for step, seconds in data.get("steps", ())))


class StepClock:
    """Times a batch body's steps one after the other: `done(step)` ends the step begun when
    the clock started or at the last done()."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self._at = time.perf_counter()

    def done(self, step: str) -> None:
        now = time.perf_counter()
        self.steps.append((step, now - self._at))
        self._at = now
