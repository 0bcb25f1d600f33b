"""Settling an at-least-once forward record by record once the broker refused part of it.

Without transactions a batch's copies land one by one: when the broker refuses one, the others
landed. Read again whole after each growing pause, the records that landed were forwarded again
at every try, once a minute for as long as the refusal lasted. So after a refusal the delay
service forwards that partition's batches with each copy's own outcome, commits up to the first
refused record, and remembers which records past it landed, not to forward them again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from redrive.errors import RedriveError

Key = tuple[str, int]


@dataclass
class Settlement:
    """What a batch forwarded record by record comes to."""

    commits: list[TopicPartition] = field(default_factory=list)
    refused: dict[Key, int] = field(default_factory=dict)  # the first refused record's offset
    landed: list[int] = field(default_factory=list)  # indexes of the copies the broker took
    why: RedriveError | None = None  # the first refusal


def settle(origins: Sequence[tuple[Key, int]], outcomes: Sequence[RedriveError | None],
           offsets: Iterable[TopicPartition]) -> Settlement:
    """`origins[i]`: the tier partition and offset copy i was read from; `outcomes[i]`: None
    where the broker took it; `offsets`: what the batch would commit with no refusal."""
    settlement = Settlement()
    for (key, offset), outcome in zip(origins, outcomes, strict=True):
        if outcome is not None:
            settlement.refused[key] = min(offset, settlement.refused.get(key, offset))
            settlement.why = settlement.why or outcome
    for index, outcome in enumerate(outcomes):
        if outcome is None:
            settlement.landed.append(index)
    for tp in offsets:
        at = settlement.refused.get((tp.topic, tp.partition), tp.offset)
        settlement.commits.append(TopicPartition(tp.topic, tp.partition, at))
    return settlement


class Landed:
    """The records past a refused one that a forward delivered, by tier partition, until the
    partition's offsets are committed past them: read again, they are not forwarded again."""

    def __init__(self) -> None:
        self._offsets: dict[Key, set[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._offsets)

    def of(self, key: Key) -> set[int] | None:
        return self._offsets.get(key)

    def note(self, settlement: Settlement, origins: Sequence[tuple[Key, int]]) -> None:
        for index in settlement.landed:
            key, offset = origins[index]
            refused_at = settlement.refused.get(key)
            if refused_at is not None and offset > refused_at:
                self._offsets.setdefault(key, set()).add(offset)

    def committed(self, offsets: Iterable[TopicPartition]) -> None:
        """Forget what lies below the committed offsets."""
        for tp in offsets:
            key = (tp.topic, tp.partition)
            kept = self._offsets.get(key)
            if kept is not None:
                kept.difference_update([o for o in kept if o < tp.offset])
                if not kept:
                    del self._offsets[key]

    def drop(self, keys: Iterable[Key]) -> None:
        """Forget revoked partitions: whoever reads them next starts from the commit."""
        for key in keys:
            self._offsets.pop(key, None)
