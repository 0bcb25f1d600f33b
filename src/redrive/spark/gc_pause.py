"""Holding Python's cyclic garbage collector off around redrive's own bulk work on executors.

With tens of thousands of tracked objects alive at once (consumed messages, a batch's rows and
records), allocations set off full collections that walk all of them and cost a third to a half
of the work, yet find nothing: this work makes no reference cycles. Only redrive's own loops are
wrapped, never a user's function, which may rely on the collector.
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
