"""Closing a group consumer within a time limit.

librdkafka's consumer close leaves the group and first waits for every offset commit it still
holds. While the group's coordinator does not answer (a broker stopped, a network partition that
keeps connections open) commits wait for a coordinator for good, and so does the close: measured
with noida-db SIGSTOPped, a runtime's close had not returned after 400 s (librdkafka issue 3740,
open). A long-running part must stop on SIGTERM within its grace period, so the close runs on a
thread of its own, and the caller goes on when the time is up. What the consumer still held was
not committed: the partitions' next owner handles those records again (at-least-once), and a
transactional runtime's offsets are in its transactions, not in these commits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("redrive.kafka")

# A close given no time at all would give up at once even with the broker answering.
LEAST_S = 2.0


def close_within(close: Callable[[], None], deadline: float, who: str) -> bool:
    """Run `close` until it returns or the monotonic `deadline` passes (at least LEAST_S from
    now); True if it returned. An exception out of `close` is raised here if it came in time."""
    outcome: list[BaseException | None] = []

    def closing() -> None:
        try:
            close()
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=closing, name=f"redrive-close-{who}", daemon=True)
    thread.start()
    thread.join(max(deadline - time.monotonic(), LEAST_S))
    if not outcome:
        log.error("%s: the consumer did not close in time (the brokers do not answer); it is "
                  "left closing in the background, and what it had not committed will be "
                  "handled again by the partitions' next owner", who)
        return False
    if outcome[0] is not None:
        raise outcome[0]
    return True
