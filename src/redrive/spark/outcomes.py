"""What a RetryPipeline did with its records, counted on the driver batch by batch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


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
