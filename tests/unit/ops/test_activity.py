"""Which dead letters the overview reads for their reasons, and its figures as JSON; no broker."""

from __future__ import annotations

from redrive.ops.activity import Activity, Reasons, Span, Written, newest


def test_a_day_within_the_cap_is_read_whole() -> None:
    found = {0: Span(day=10, hour=15, end=20), 1: Span(day=5, hour=5, end=5)}
    assert newest(found, cap=10) == {0: (10, 20)}  # partition 1 wrote nothing that day


def test_over_the_cap_each_partition_reads_its_newest_share() -> None:
    found = {0: Span(day=0, hour=700, end=900), 1: Span(day=1, hour=50, end=100),
             2: Span(day=3, hour=3, end=4)}
    window = newest(found, cap=100)
    assert window == {0: (810, 900), 1: (91, 100), 2: (3, 4)}  # 90, 9 and at least 1
    assert sum(end - start for start, end in window.values()) <= 100 + len(found)


def test_rates_are_per_minute_over_the_last_hour() -> None:
    figures = Activity(Written(hour=120, day=1_000), Written(hour=1, day=2), Written(0, 0),
                       Reasons({"exhausted": 1}, True), Reasons({}, False)).to_json()
    assert figures["received"] == {"hour": 120, "day": 1_000, "per_minute": 2.0}
    assert figures["retries"]["per_minute"] == 0.017
    assert figures["reasons_hour"] == {"counts": {"exhausted": 1}, "complete": True}
    assert figures["reasons_day"]["complete"] is False
