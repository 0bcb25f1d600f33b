"""What one poll of the delay service forwards, and where to rewind to if that fails."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from redrive import kafka

Key = tuple[str, int]


@dataclass
class Batch:
    out: list[kafka.OutRecord] = field(default_factory=list)
    offsets: list[TopicPartition] = field(default_factory=list)
    starts: dict[Key, int] = field(default_factory=dict)
    hops: dict[str, int] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    malformed: int = 0
    sources: dict[str, set[Key]] = field(default_factory=dict)  # by topic written: read from
    origins: list[tuple[Key, int]] = field(default_factory=list)  # each copy's record
    late_by: dict[int, int] = field(default_factory=dict)  # lateness by copy, delivered ones

    def add(self, source: Key, offset: int, record: kafka.OutRecord) -> None:
        self.out.append(record)
        self.origins.append((source, offset))
        self.sources.setdefault(record.topic, set()).add(source)

    def split(self, dead_letter: str) -> list[Batch]:
        """One batch per tier partition read, with its own copies, offsets and counts: a
        transaction the broker refused says nothing of which copy it refused, so the partitions
        are tried again each in a transaction of its own."""
        parts = []
        for key, start in self.starts.items():
            part = self.part([index for index, (source, _) in enumerate(self.origins)
                              if source == key], dead_letter)
            part.starts = {key: start}
            part.offsets = [tp for tp in self.offsets if (tp.topic, tp.partition) == key]
            if part.out or part.offsets:
                parts.append(part)
        return parts

    def part(self, indexes: Iterable[int], dead_letter: str) -> Batch:
        """These copies alone, with their counts (those the broker took, or one partition's)."""
        part = Batch()
        for index in indexes:
            record = self.out[index]
            part.add(*self.origins[index], record)
            if record.topic == dead_letter:
                part.malformed += 1
            elif index in self.late_by:
                part.delivered[record.topic] = part.delivered.get(record.topic, 0) + 1
                part.late_by[len(part.out) - 1] = self.late_by[index]
            else:
                part.hops[record.topic] = part.hops.get(record.topic, 0) + 1
        return part
