"""The demo's per-id accounting (demo/accounting.py) on counted inputs, including the review's
injections: a duplicate dead letter, a dead letter for an order that succeeded, a validator dead
letter for a valid order, and a duplicate retry copy still waiting."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest

from redrive.spark.outcomes import PipelineStats

DEMO = Path(__file__).resolve().parents[2] / "demo"
if str(DEMO) not in sys.path:
    sys.path.insert(0, str(DEMO))

import accounting  # noqa: E402
from accounting import Expected, Seen  # noqa: E402

EXHAUSTED = "exhausted (UpstreamUnavailable)"
PARSE = "not-retryable (ParseError)"


def succeeded(attempt: int) -> Seen:
    return Seen(valid=1, succeeded=[attempt], retry_copies=Counter(range(1, attempt + 1)))


def dead() -> Seen:
    return Seen(valid=1, dead=[EXHAUSTED], retry_copies=Counter({1: 1, 2: 1, 3: 1}))


def rules(order_id: int) -> Expected:
    """A small stand-in for the demo's rules: 1 is rejected, 2 dead-lettered, 3 succeeds after
    two retries, the rest on their first try."""
    if order_id == 1:
        return Expected("rejected", PARSE)
    if order_id == 2:
        return Expected("dead", EXHAUSTED, 3)
    return Expected("succeeded", None, 2 if order_id == 3 else 0)


def clean() -> dict[int, Seen]:
    seen = {1: Seen(rejected=[PARSE]), 2: dead(), 3: succeeded(2)}
    seen.update({order_id: succeeded(0) for order_id in range(4, 11)})
    return seen


def test_one_outcome_per_id_passes() -> None:
    result = accounting.tally(clean(), range(1, 11), rules, interrupted=False)
    assert result.categories == Counter({accounting.OK: 10})
    assert not result.failed


def test_the_reviews_injections_are_each_caught() -> None:
    seen = clean()
    seen[2].dead.append(EXHAUSTED)  # the same dead letter twice
    seen[4].dead.append(EXHAUSTED)  # a dead letter for an order that also succeeded
    seen[5].rejected.append(PARSE)  # a validator dead letter for a valid, succeeded order
    result = accounting.tally(seen, range(1, 11), rules, interrupted=False)
    assert result.categories[accounting.TWICE] == 1
    assert result.categories[accounting.CONFLICT] == 2
    assert result.examples == {accounting.TWICE: [2], accounting.CONFLICT: [4, 5]}
    assert result.failed


def test_a_second_row_or_valid_record_is_written_twice() -> None:
    seen = clean()
    seen[6].succeeded.append(0)
    seen[7].valid = 2
    result = accounting.tally(seen, range(1, 11), rules, interrupted=False)
    assert result.examples == {accounting.TWICE: [6, 7]}


def test_a_duplicate_retry_copy_still_waiting_is_caught() -> None:
    seen = clean()
    seen[3].retry_copies[2] += 1  # the review's pending.py: a second retry.2s copy
    seen[8].retry_copies[1] += 1  # a copy past the try that succeeded
    result = accounting.tally(seen, range(1, 11), rules, interrupted=False)
    assert result.examples == {accounting.WAITING: [3, 8]}
    # An interruption does not excuse it: it can only become a second outcome.
    assert accounting.tally(seen, range(1, 11), rules, interrupted=True).failed


def test_no_outcome_is_lost_or_waiting_unless_the_run_was_interrupted() -> None:
    seen = clean()
    del seen[9]  # never left `orders`
    seen[10] = Seen(valid=1, retry_copies=Counter({1: 1}))  # waiting in retry.1s
    result = accounting.tally(seen, range(1, 11), rules, interrupted=False)
    assert result.examples == {accounting.LOST: [9], accounting.WAITING: [10]}
    interrupted = accounting.tally(seen, range(1, 11), rules, interrupted=True)
    assert interrupted.examples == {accounting.PENDING: [9, 10]}
    assert not interrupted.failed


def test_outcomes_off_the_rules_are_caught() -> None:
    seen = clean()
    seen[4] = dead()  # should have succeeded on its first try
    seen[3] = succeeded(1)  # should have needed two retries
    seen[5] = Seen(valid=1, succeeded=[1])  # attempt 1 with no retry copy to carry it
    seen[12] = succeeded(0)  # never produced
    result = accounting.tally(seen, range(1, 11), rules, interrupted=False)
    assert result.examples == {accounting.UNEXPECTED: [3, 4, 5, 12]}


def test_an_outcome_without_a_valid_record() -> None:
    seen = clean()
    seen[6].valid = 0
    result = accounting.tally(seen, range(1, 11), None, interrupted=False)
    assert result.examples == {accounting.NO_INPUT: [6]}


def test_handled_before_due_from_the_sink_rows() -> None:
    rows = [(0, 100, None), (1, 2_000, 2_000), (2, 1_999, 2_000), (1, 5_000, None)]
    assert accounting.handled_before_due(rows) == 2


def test_the_demos_rules_give_the_readme_figures() -> None:
    import orders

    outcomes: Counter[tuple[str, str | None, int]] = Counter()
    for order_id in range(1, 20_001):
        found = orders.expected(order_id)
        outcomes[found.outcome, found.reason, found.retries] += 1
    assert outcomes == Counter({
        ("rejected", "malformed (MalformedHeader)", 0): 13,
        ("rejected", "not-retryable (ParseError)", 0): 16,
        ("rejected", "not-retryable (ValidationError)", 0): 20,
        ("succeeded", None, 0): 16806, ("succeeded", None, 1): 1967,
        ("succeeded", None, 2): 777, ("succeeded", None, 3): 299,
        ("dead", "exhausted (UpstreamUnavailable)", 3): 102,
    })


class FakePipeline:
    """run() as RetryPipeline's: it polls until(stats) and gives up at its timeout."""

    group = "fake"

    def __init__(self, finishes_after: int) -> None:
        self.finishes_after = finishes_after

    def run(self, *, until: Any, timeout_s: float) -> PipelineStats:
        stats = PipelineStats()
        deadline = time.monotonic() + timeout_s
        polls = 0
        while time.monotonic() < deadline:
            polls += 1
            stats.records = min(polls, self.finishes_after)
            if until(stats):
                break
            time.sleep(0.02)
        return stats


def run_fake(finishes_after: int, timeout_s: float, send: bool = False) -> Any:
    import orders

    interrupts = orders.Interrupts()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        interrupts.install()
        interrupts.deferred = True
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        if send:
            timer.start()
        orders.run_stage(cast(Any, FakePipeline(finishes_after)),
                         lambda stats: stats.records >= 10, timeout_s, interrupts)
    finally:
        if send:
            timer.join()  # the signal must land while the test's handler is installed
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return interrupts


def test_a_stage_that_got_there_is_not_stopped() -> None:
    assert not run_fake(10, timeout_s=30).stopped


def test_a_stage_cut_by_its_timeout_exits_124() -> None:
    interrupts = run_fake(3, timeout_s=0.3)
    assert interrupts.timed_out and interrupts.signal is None
    assert interrupts.exit_status() == 124


def test_sigterm_during_a_stage_stops_it_and_exits_143() -> None:
    interrupts = run_fake(3, timeout_s=30, send=True)
    assert interrupts.signal == signal.SIGTERM and not interrupts.timed_out
    assert interrupts.exit_status() == 143


def test_sigterm_outside_the_stages_raises_system_exit_143() -> None:
    import orders

    interrupts = orders.Interrupts()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        interrupts.install()
        with pytest.raises(SystemExit) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here, in the main thread
        assert caught.value.code == 143
        interrupts.cleaning = True  # a second signal must not cut the clean-up short
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_runs_against_a_cluster_of_ones_own_get_names_of_their_own() -> None:
    import orders

    from redrive import topics

    first, second = orders.Names.for_run("a1b2c3d4"), orders.Names.for_run("e5f6a7b8")
    assert (first.topic, first.valid_topic, first.validator, first.group) == (
        "orders-a1b2c3d4", "orders-a1b2c3d4.valid", "validator-a1b2c3d4", "enricher-a1b2c3d4")
    planned = [set(topics.plan(orders.ENRICH_POLICY, names.valid_topic, names.group)
                   .created_topics) for names in (first, second)]
    assert not planned[0] & planned[1]
    assert orders.Names().valid_topic == "orders.valid"  # the embedded broker keeps the README's
