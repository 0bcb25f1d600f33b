"""The due gate: the one rule every runtime uses to keep records from being processed early.

Records of one retry-topic or delay-tier partition all waited the same delay, so their due times
rise with the offset, and admitting everything up to the first record that is not yet due is exact.
A record without a due time is always due. The gate never admits a record whose due time is
later than `now_ms`, even if due times in a run are not in order (a record produced by hand, a
clock step): it stops at the first such record, and everything behind it waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redrive import headers as h
from redrive.errors import MalformedHeader


@dataclass(frozen=True)
class Admission:
    """How many records at the head of a run may be processed now, and when the next one is due."""

    count: int
    next_due_ms: int | None  # due time of the first held-back record; None if all were admitted

    @property
    def held(self) -> bool:
        return self.next_due_ms is not None


def due_of(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    """A record's due time; None if it has none.

    A malformed due time counts as due now, so that the record reaches routing, which sends it to
    the dead-letter topic with reason `malformed` instead of letting it block its partition.
    """
    try:
        return h.read_due(headers)
    except MalformedHeader:
        return None


def is_due(due_ms: int | None, now_ms: int) -> bool:
    return due_ms is None or due_ms <= now_ms


def admit(due_times: Iterable[int | None], now_ms: int) -> Admission:
    """Admit the longest prefix of a partition's run whose records are all due at `now_ms`."""
    count = 0
    for due in due_times:
        if not is_due(due, now_ms):
            return Admission(count, due)
        count += 1
    return Admission(count, None)
