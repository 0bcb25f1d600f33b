"""Stats arithmetic on hand-made offset snapshots, and retry-topic discovery."""

from __future__ import annotations

import pytest

from redrive.cli.ops import stats_rows
from redrive.errors import UnknownTopic
from redrive.kafka.admin import PartitionOffsets
from redrive.ops.stats import (
    DEAD_LETTER,
    MAIN,
    RETRY,
    Head,
    Roles,
    Snapshot,
    discover_retry_topics,
    roles,
    summarize,
)
from redrive.policy import Backoff, RetryPolicy


def test_discovery_orders_by_delay_or_attempt_and_ignores_other_groups() -> None:
    existing = ["orders", "orders.billing.retry.1m", "orders.billing.retry.500ms",
                "orders.billing.retry.5s", "orders.audit.retry.1s", "orders.billing.dlt",
                # the retry topic of another topic (whose name happens to start alike)
                "orders.billing.retry.5s.billing.retry.1s"]
    assert discover_retry_topics(existing, "orders", "billing") == [
        "orders.billing.retry.500ms", "orders.billing.retry.5s", "orders.billing.retry.1m"]
    assert discover_retry_topics(["o.g.retry.10", "o.g.retry.2"], "o", "g") == \
        ["o.g.retry.2", "o.g.retry.10"]


def test_roles_from_the_cluster_or_the_policy() -> None:
    counts = {"orders": 1, "orders.g.retry.1s": 1, "orders.g.dlt": 1}
    assert roles(counts, "orders", "g") == Roles("orders", ("orders.g.retry.1s",), "orders.g.dlt")
    with pytest.raises(UnknownTopic, match=r"orders\.g\.retry\.2s"):
        roles(counts, "orders", "g", RetryPolicy(backoff=Backoff.sequence("1s,2s")))
    with pytest.raises(UnknownTopic, match="'nope'"):
        roles(counts, "nope", "g")


def test_summary_counts_waiting_lag_and_window() -> None:
    layout = Roles("m", ("m.g.retry.1s",), "m.g.dlt")
    before = Snapshot(1_000, {
        "m": {0: PartitionOffsets(0, 10, 4), 1: PartitionOffsets(5, 8, None)},
        "m.g.retry.1s": {0: PartitionOffsets(0, 3, 1)},
        "m.g.dlt": {0: PartitionOffsets(2, 6, None)},
    })
    after = Snapshot(3_000, {
        "m": {0: PartitionOffsets(0, 16, 10), 1: PartitionOffsets(5, 9, None)},
        "m.g.retry.1s": {0: PartitionOffsets(0, 5, 2)},
        "m.g.dlt": {0: PartitionOffsets(2, 7, None)},
    })
    heads = {("m", 0): Head(500, None), ("m", 1): Head(200, None),
             ("m.g.retry.1s", 0): Head(900, 2_500), ("m.g.dlt", 0): Head(100, None)}
    week = 7 * 24 * 3600 * 1000
    main, retry, dlt = summarize(layout, before, after, heads, {"m.g.dlt": week})
    assert (main.role, main.waiting, main.lag, main.oldest_ms) == (MAIN, 6 + 4, 6, 200)
    assert (main.appended, main.consumed, main.rate(main.appended)) == (7, 6 + 0, 3.5)
    assert (retry.role, retry.waiting, retry.lag, retry.next_due_ms) == (RETRY, 3, 3, 2_500)
    assert (retry.appended, retry.consumed) == (2, 1)
    assert (dlt.role, dlt.waiting, dlt.lag, dlt.consumed) == (DEAD_LETTER, 5, None, None)
    # Retention deletes the oldest dead letter a week after it was written; the others keep.
    assert (dlt.oldest_deleted_ms, main.oldest_deleted_ms) == (100 + week, None)
    table = stats_rows([main, retry, dlt], 3_000)
    assert table[1][5] == "500ms ago"
    assert [row[6] for row in table] == ["-", "-", "in 6d23h"]
    assert table[2][7:] == ["0.5", "-"]


def test_a_partition_holding_only_transaction_markers_waits_none() -> None:
    """A transactional group commits past its last record; the commit marker after it is one
    more offset, read as one record waiting forever by offsets alone (4 partitions: 4)."""
    layout = Roles("m", ("m.g.retry.1s",), "m.g.dlt")
    shot = Snapshot(1_000, {
        "m": {0: PartitionOffsets(0, 11, 10), 1: PartitionOffsets(0, 21, 10)},
        "m.g.retry.1s": {0: PartitionOffsets(0, 4, 3)},
        "m.g.dlt": {0: PartitionOffsets(0, 0, None)},
    })
    heads = {("m", 1): Head(200, None)}  # partition 1 holds records past the commit
    main, retry, _ = summarize(layout, shot, shot, heads)
    assert (main.waiting, main.lag) == (11, 11)
    assert (retry.waiting, retry.lag, retry.oldest_ms) == (0, 0, None)


def test_a_first_commit_within_the_window_does_not_count_what_came_before_it() -> None:
    # A group started at the latest offset: nothing committed, then a commit at 100,040.
    layout = Roles("m", (), None)
    before = Snapshot(1_000, {"m": {0: PartitionOffsets(0, 100_000, None),
                                    1: PartitionOffsets(0, 50, 30)}})
    after = Snapshot(3_000, {"m": {0: PartitionOffsets(0, 100_040, 100_040),
                                   1: PartitionOffsets(0, 60, 40)}})
    [main] = summarize(layout, before, after, {})
    assert (main.consumed, main.rate(main.consumed)) == (10, 5.0)  # partition 1's only
    alone = Roles("m", (), None)
    [only] = summarize(alone, Snapshot(1_000, {"m": {0: before.offsets["m"][0]}}),
                       Snapshot(3_000, {"m": {0: after.offsets["m"][0]}}), {})
    assert only.consumed is None  # nothing to count from: not shown
