"""The one wall clock every part of redrive reads: epoch milliseconds, as headers carry them.

Due times are compared with this clock wherever a record is gated (consumer, delay service,
Spark driver and executors, store scheduler), so they must all round the same way.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch, rounded down."""
    return time.time_ns() // 1_000_000
