"""The records every fault sends and the handler rule they meet.

Records are decimal numbers 0..N-1, each sent once, so every outcome can be traced to its record.
About 10 % fail their first delivery and 1 % fail every delivery (and end as dead letters).
"""

from __future__ import annotations

DELAY = "500ms"
ATTEMPTS = 3


class Flaky(Exception):
    """The handler's failure; the policy retries it."""


def fails_once(number: int) -> bool:
    return number % 10 == 3


def always_fails(number: int) -> bool:
    return number % 100 == 7


def fails(number: int, attempt: int) -> bool:
    return always_fails(number) or (fails_once(number) and attempt == 0)


def retry_attempts(number: int) -> set[int]:
    """The attempts a number's retry copies go to: after each failure but the last."""
    if always_fails(number):
        return set(range(1, ATTEMPTS))
    return {1} if fails_once(number) else set()


def values(count: int) -> list[bytes]:
    return [str(n).encode() for n in range(count)]
