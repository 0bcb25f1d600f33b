"""How many main-topic records a poll takes while the group also reads retry topics.

Retries are taken between poll batches, so a retry that falls due while the main topic is a
backlog waits for the batch in hand. With a 5 ms handler a 500-record batch is 2.5 s of waiting
(retries due behind a backlog were handled 3.4 s late at the median, 2026-11-27); a batch cut to
about SLICE_S of handling keeps that wait near SLICE_S whatever the handler costs. Fast handlers
still take whole batches (20 us a record: 5,000 fit in the slice).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

# Longer slices mean fewer, larger commits (transactions, in transactional mode); shorter ones a
# retry handled sooner. The lateness goal behind a backlog is 250 ms at the 99th percentile.
SLICE_S = 0.1
# Until a batch has been timed: few enough records to be short whatever the handler costs.
FIRST = 32
# How much of a faster batch's time per record is taken in: a handler that slows down cuts the
# next batch at once, one that speeds up grows it over a few batches.
EASING = 0.3


class MainBatchSize:
    """The main-topic batch size that keeps a batch's handling near SLICE_S."""

    def __init__(self, most: int, slice_s: float = SLICE_S) -> None:
        self.most = most
        self.slice_s = slice_s
        self._per_record_s: float | None = None  # nothing timed yet

    def size(self, reading_retries: bool = True) -> int:
        """Records to take from the main topics now; all `most` while no retry can wait."""
        if not reading_retries:
            return self.most
        if self._per_record_s is None:
            return min(self.most, FIRST)
        if self._per_record_s * self.most <= self.slice_s:
            return self.most
        return max(1, int(self.slice_s / self._per_record_s))

    def timed(self, handle: Callable[..., object], records: Sequence[object],
              *args: object) -> None:
        """Handle a poll batch's records (retries and main records), timing it. Only the
        records' handling is timed: a batch's fixed costs (its commit, a transaction) would
        read as a slow handler and shrink batches whose commits then cost more."""
        started = time.perf_counter()
        handle(records, *args)
        self.took(len(records), time.perf_counter() - started)

    def took(self, records: int, seconds: float) -> None:
        """A batch of `records` (retries and main records) took `seconds` to handle."""
        if records <= 0:
            return
        per_record = seconds / records
        if self._per_record_s is None or per_record >= self._per_record_s:
            self._per_record_s = per_record
        else:
            self._per_record_s += EASING * (per_record - self._per_record_s)
