"""Holding Python's cyclic garbage collector off around redrive's own bulk work: the Spark
executors' reads and routing, the delay service's polls, and the on-call tools' reads of a
dead-letter topic and replays.

With tens of thousands of tracked objects alive at once (consumed messages, a batch's rows and
records, dead letters), allocations set off full collections that walk all of them and cost a
quarter to a half of the work, yet find nothing: this work makes no reference cycles. Only
redrive's own loops are wrapped, never a user's handler, which may rely on the collector. The
collector is the process's: another thread's garbage waits for the block's end, and where two
blocks overlap the first to end turns it back on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block, and back on after it if it was on before."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
