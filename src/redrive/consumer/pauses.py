"""Which partitions are paused, at which offset, and when each may resume.

A partition is held when the record at its head must wait: a retry copy that is not due yet, or a
record waiting for its next in-place attempt. The runtime pauses the partition and seeks it back to
that record; this bookkeeping says when to resume it and how long `poll()` may block meanwhile.
Pure: no clients, no clock, so the rules are unit-tested on their own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

TopicPartition = tuple[str, int]


class Why(enum.Enum):
    DUE = "due"  # the head is a retry copy whose redrive-due is still ahead
    IN_PLACE = "in-place"  # the head failed and waits for its next in-place attempt


@dataclass(frozen=True)
class Hold:
    offset: int  # the record the partition was sought back to
    until_ms: int  # resume at or after this local-clock time
    why: Why
    since_ms: int  # when the held record was written (its timestamp), for the age gauge


class Holds:
    def __init__(self) -> None:
        self._holds: dict[TopicPartition, Hold] = {}

    def hold(self, tp: TopicPartition, hold: Hold) -> None:
        self._holds[tp] = hold

    def __contains__(self, tp: object) -> bool:
        return tp in self._holds

    def __len__(self) -> int:
        return len(self._holds)

    def release_due(self, now_ms: int) -> list[TopicPartition]:
        """Forget and return every partition whose hold has run out at `now_ms`."""
        due = [tp for tp, hold in self._holds.items() if hold.until_ms <= now_ms]
        for tp in due:
            del self._holds[tp]
        return due

    def drop(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget the holds of these partitions (revoked or lost); return those that were held."""
        dropped = [tp for tp in tps if tp in self._holds]
        for tp in dropped:
            del self._holds[tp]
        return dropped

    def wait_s(self, now_ms: int, longest_s: float) -> float:
        """How long poll() may block: until the next hold runs out, at most `longest_s`."""
        if not self._holds:
            return longest_s
        soonest = min(hold.until_ms for hold in self._holds.values())
        return max(0.0, min(longest_s, (soonest - now_ms) / 1000.0))

    def oldest_age_s(self, now_ms: int) -> float:
        """Age of the oldest record held until it is due (0 when none is); records held for an
        in-place retry are not pending retries."""
        ages = [now_ms - hold.since_ms for hold in self._holds.values() if hold.why is Why.DUE]
        return max(0.0, max(ages) / 1000.0) if ages else 0.0
