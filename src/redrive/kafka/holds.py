"""Holding a partition at a record until a time: pause, seek back, resume when due.

A partition is held when the record at its head must wait: a retry copy or a delayed record that
is not due yet, a record waiting for its next in-place attempt, one that would pass a
dead-letter limit, or one whose copy the broker refused (`Refusals`). The partition is paused
and sought back to that record, so the records fetched behind it are dropped and fetched again
after the resume (the consumer runtime's retry reader keeps them instead:
`redrive.consumer.readers`); `poll()` keeps running meanwhile, so the member stays in its group
and the other partitions go on. The consumer runtime and the delay service both hold partitions
here.

A hold lives in this process only: when a partition is revoked or lost its hold is released (and
the partition resumed, since librdkafka keeps a partition's pause flag across unassign and assign),
and the partition's next owner reads it again from the committed offset.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from confluent_kafka import TopicPartition

from redrive.kafka.records import PartitionKey


class Pausable(Protocol):
    """What holding needs of a consumer (confluent_kafka.Consumer has it)."""

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...


class Why(enum.Enum):
    DUE = "due"  # the head is a record whose due time is still ahead
    IN_PLACE = "in-place"  # the head failed and waits for its next in-place attempt
    BRAKE = "brake"  # the head would pass a dead-letter limit: it waits for an operator
    REFUSED = "refused"  # a copy of the head's batch was refused: it waits to be handled again


@dataclass(frozen=True)
class Hold:
    offset: int  # the record the partition was sought back to
    until_ms: int  # resume at or after this local-clock time
    why: Why
    since_ms: int  # when the held record was written (its timestamp), for the age gauge


class Holds:
    """The held partitions of one consumer."""

    def __init__(self) -> None:
        self._holds: dict[PartitionKey, Hold] = {}

    def __contains__(self, tp: object) -> bool:
        return tp in self._holds

    def __len__(self) -> int:
        return len(self._holds)

    def hold(self, consumer: Pausable, tp: PartitionKey, hold: Hold) -> None:
        """Pause `tp` and seek it back to `hold.offset` until `hold.until_ms`. A brake's hold
        stays one, moved to the lower offset: only a resume or the cool-off ends it, not the
        end of a refusal's pause that rewound below it."""
        held = self._holds.get(tp)
        if held is not None and held.why is Why.BRAKE and hold.why is not Why.BRAKE:
            hold = replace(held, offset=min(held.offset, hold.offset))
        position = TopicPartition(tp[0], tp[1], hold.offset)
        consumer.pause([position])
        consumer.seek(position)
        self._holds[tp] = hold

    def release_due(self, consumer: Pausable, now_ms: int) -> list[PartitionKey]:
        """Resume and forget every partition whose hold has run out at `now_ms`."""
        due = [tp for tp, hold in self._holds.items() if hold.until_ms <= now_ms]
        return self.release(consumer, due)

    def release(self, consumer: Pausable, tps: Iterable[PartitionKey]) -> list[PartitionKey]:
        """Resume and forget the holds of these partitions (due, rewound, revoked or lost);
        return those that were held."""
        held = [tp for tp in tps if tp in self._holds]
        for tp in held:
            del self._holds[tp]
        if held:
            consumer.resume([TopicPartition(topic, partition) for topic, partition in held])
        return held

    def wait_s(self, now_ms: int, longest_s: float) -> float:
        """How long poll() may block: until the next hold runs out, at most `longest_s`."""
        if not self._holds:
            return longest_s
        soonest = min(hold.until_ms for hold in self._holds.values())
        return max(0.0, min(longest_s, (soonest - now_ms) / 1000.0))

    def oldest_since_ms(self) -> int | None:
        """Since when the oldest record held until it is due has waited (None when none is);
        records held for an in-place retry are not pending retries."""
        return min((hold.since_ms for hold in self._holds.values() if hold.why is Why.DUE),
                   default=None)


class Refusals:
    """Pauses after the broker refused what a partition's records made (a copy larger than its
    topic takes, a topic the client may not write): refused again as soon as they are read
    again, they would be retried as fast as the loop runs. A partition waits 1 s after its
    first refusal, doubling to a minute while they go on, until `forget` (its offsets
    committed). The store's scheduler keeps them per row (keyed by the row's id)."""

    FIRST_S = 1.0
    LONGEST_S = 60.0

    def __init__(self) -> None:
        self._last_s: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._last_s)

    def __contains__(self, key: object) -> bool:
        return key in self._last_s

    def pause_s(self, key: Hashable) -> float:
        """The next pause of `key`, refused once more."""
        pause_s = min(self.LONGEST_S, self._last_s.get(key, self.FIRST_S / 2) * 2)
        self._last_s[key] = pause_s
        return pause_s

    def hold(self, holds: Holds, consumer: Pausable, tp: PartitionKey, offset: int,
             now_ms: int) -> float:
        """Hold `tp` at `offset` for its next pause; return the pause in seconds."""
        pause_s = self.pause_s(tp)
        holds.hold(consumer, tp, Hold(offset, now_ms + int(pause_s * 1000), Why.REFUSED, now_ms))
        return pause_s

    def forget(self, keys: Iterable[Hashable]) -> None:
        if self._last_s:
            for key in keys:
                self._last_s.pop(key, None)
