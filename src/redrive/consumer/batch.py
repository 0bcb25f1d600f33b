"""What one poll batch did, per partition: what to commit, what to produce, where to rewind.

Offsets are committed after each batch, and only up to the last record finished (handled, skipped,
or routed with its copy acknowledged) on each partition. Records of a partition are handled in
order and a partition stops for the rest of the batch at the first record that must wait, so the
finished records of a partition are always a contiguous run from its first record in the batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from redrive.kafka import OutRecord
from redrive.kafka.records import PartitionKey
from redrive.routing import DeadLetter, Retry


@dataclass(frozen=True)
class Copy:
    """A routed record: the copy to produce and what to count once the broker has it."""

    record: OutRecord | None  # None: dead-lettered with no dead-letter topic (dropped)
    decision: Retry | DeadLetter
    main_topic: str
    tp: PartitionKey  # where the copied record was read
    offset: int


@dataclass
class Batch:
    first: dict[PartitionKey, int] = field(default_factory=dict)
    finished: dict[PartitionKey, int] = field(default_factory=dict)
    stopped: set[PartitionKey] = field(default_factory=set)
    copies: list[Copy] = field(default_factory=list)
    copied: set[PartitionKey] = field(default_factory=set)  # partitions with records in copies
    processed: Counter[str] = field(default_factory=Counter)  # handled successfully, by main topic
    # Handler calls left until the next one timed for the handler-time histogram, counting it:
    # the first call of a batch is timed, then one in runtime.HANDLER_SAMPLE.
    until_sample: int = 1
    handler_times: list[float] = field(default_factory=list)  # observed once the batch is done
    lateness: list[float] = field(default_factory=list)  # retries' seconds past due, likewise

    def finish(self, tp: PartitionKey, offset: int) -> None:
        self.finished[tp] = offset

    def stop(self, tp: PartitionKey) -> None:
        self.stopped.add(tp)

    def route(self, copy: Copy) -> None:
        self.copies.append(copy)
        self.copied.add(copy.tp)
        self.finished[copy.tp] = copy.offset

    def commit_offsets(self) -> dict[PartitionKey, int]:
        """The offsets to commit: the next record to read on each partition that moved."""
        return {tp: offset + 1 for tp, offset in self.finished.items()}

    @property
    def out_records(self) -> list[OutRecord]:
        return [copy.record for copy in self.copies if copy.record is not None]
