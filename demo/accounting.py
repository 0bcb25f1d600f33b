"""The demo's accounting: what became of each order id, from what the broker and the sink hold.

Everything is counted, never collected into sets or dicts keyed by id: a copy found twice must
count twice, or a duplicate dead letter or a second outcome would vanish into the one it repeats.
Each id must have exactly one path: one validator dead letter and nothing else, or one record in
`orders.valid` and then exactly one sink row or enricher dead letter, with one retry copy per
retry before it. Kept apart from orders.py (no Kafka, no Spark) so tests can feed it counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

OK = "ok"
CONFLICT = "more than one outcome"
TWICE = "written twice"
WAITING = "still waiting in a retry topic"
LOST = "lost"
PENDING = "pending (run interrupted)"
NO_INPUT = "outcome with no valid record"
UNEXPECTED = "outcome not as the demo's rules say"

# In the order the table prints them; each failing id is counted under the first that applies.
PROBLEMS = (UNEXPECTED, CONFLICT, TWICE, WAITING, NO_INPUT, LOST)


@dataclass
class Seen:
    """Where one order id was found after the run; every copy found is counted."""

    rejected: list[str] = field(default_factory=list)  # validator dead letters' reasons
    valid: int = 0  # records in orders.valid
    succeeded: list[int] = field(default_factory=list)  # the sink rows' attempts
    dead: list[str] = field(default_factory=list)  # enricher dead letters' reasons
    retry_copies: Counter[int] = field(default_factory=Counter)  # enricher retry -> copies
    validator_retry_copies: int = 0


@dataclass(frozen=True)
class Expected:
    """What the demo's fixed rules make of an id: its outcome, the dead letter's reason, and
    how many retries (one retry copy each) come before it."""

    outcome: str  # "rejected", "succeeded" or "dead"
    reason: str | None = None
    retries: int = 0


def classify(seen: Seen, expected: Expected | None, interrupted: bool) -> str:
    """One category per id: OK, or the first problem found (see PROBLEMS), or PENDING when the
    run was interrupted before the id reached an end."""
    finals = sum(1 for found in (seen.rejected, seen.succeeded, seen.dead) if found)
    if finals > 1 or (seen.rejected and (seen.valid or seen.retry_copies)):
        return CONFLICT
    if max(len(seen.rejected), seen.valid, len(seen.succeeded), len(seen.dead)) > 1:
        return TWICE
    # A second copy of one retry, or a copy past the try that succeeded, is either still
    # waiting or already a duplicate in the making: never a legitimate state.
    if any(n > 1 for n in seen.retry_copies.values()) or (
            seen.succeeded and any(retry > seen.succeeded[0] for retry in seen.retry_copies)):
        return WAITING
    if not finals:
        if interrupted:
            return PENDING
        return WAITING if seen.retry_copies or seen.validator_retry_copies else LOST
    if (seen.succeeded or seen.dead) and not seen.valid:
        return NO_INPUT
    if expected is not None and actual(seen) != expected:
        return UNEXPECTED
    return OK


def actual(seen: Seen) -> Expected:
    """What the run did with an id that has exactly one outcome, in Expected's terms."""
    if seen.validator_retry_copies:
        # Nothing in stage 1 is retryable: a copy there is outside the rules whatever follows.
        return Expected("stage 1 retried", None, seen.validator_retry_copies)
    copies = sorted(seen.retry_copies)
    contiguous = copies == list(range(1, len(copies) + 1))
    retries = len(copies) if contiguous else -1
    if seen.rejected:
        return Expected("rejected", seen.rejected[0], 0)
    if seen.succeeded:
        # The row's attempt must agree with the copies that carried it there.
        return Expected("succeeded", None, retries if retries == seen.succeeded[0] else -1)
    return Expected("dead", seen.dead[0], retries)


@dataclass
class Tally:
    categories: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(self.categories[problem] for problem in PROBLEMS)


def tally(seen: Mapping[int, Seen], produced: Iterable[int],
          expected: Callable[[int], Expected] | None, interrupted: bool) -> Tally:
    """Every produced id, and every id found that was not produced (always UNEXPECTED)."""
    produced = set(produced)
    result = Tally()
    for order_id in sorted(produced | set(seen)):
        if order_id in produced:
            category = classify(seen.get(order_id, Seen()),
                                None if expected is None else expected(order_id), interrupted)
        else:
            category = UNEXPECTED
        result.categories[category] += 1
        if category != OK:
            result.examples.setdefault(category, []).append(order_id)
    return result


def handled_before_due(rows: Iterable[tuple[int, int | None, int | None]]) -> int:
    """Sink rows (attempt, handled ms, due ms of the copy handled) handled before that copy was
    due, or retried with no due time to check: worked out from the sink, not the pipeline."""
    early = 0
    for attempt, handled_ms, due_ms in rows:
        if attempt > 0 and (due_ms is None or handled_ms is None or handled_ms < due_ms):
            early += 1
    return early
