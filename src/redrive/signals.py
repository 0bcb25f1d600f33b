"""Turn SIGTERM (and SIGINT) into a clean stop request while a long-running part runs.

Python lets only the main thread install signal handlers; a consumer, delay service or scheduler
run from another thread leaves signals alone and is stopped with `stop()` by its owner.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(request_stop: Callable[[], None],
                    signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
