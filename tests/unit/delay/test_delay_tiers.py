from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import gate
from redrive.delay.schedule import check_target, due_ms_of
from redrive.delay.tiers import DEFAULT_TIERS, Tier, Tiers, hop_due
from redrive.errors import InvalidArgument

tier_sets = st.lists(st.integers(min_value=1, max_value=4_000_000), min_size=1, max_size=6,
                     unique=True).map(Tiers.of)
delays = st.integers(min_value=-1_000, max_value=50_000_000)
latencies = st.lists(st.integers(min_value=0, max_value=5_000), max_size=40)


def travel(tiers: Tiers, delay_ms: int, latencies_ms: list[int]) -> tuple[list[Tier], int]:
    """A lone record's hops and arrival time, as the service moves it; hop i takes
    latencies_ms[i] longer than its gate (poll, transaction)."""
    hops: list[Tier] = []
    now = 0
    while (tier := tiers.next_hop(delay_ms - now)) is not None:
        assert len(hops) < 100_000, "the cascade does not converge"
        latency = latencies_ms[len(hops)] if len(hops) < len(latencies_ms) else 0
        hops.append(tier)
        now = hop_due(now, tier.delay_ms, delay_ms) + latency
    return hops, now


@given(tier_sets, delays, latencies)
def test_cascade_never_arrives_before_the_due_time(tiers: Tiers, delay: int,
                                                  lat: list[int]) -> None:
    hops, arrival = travel(tiers, delay, lat)
    assert arrival >= delay
    if not hops:
        assert delay <= 0 and arrival == 0
        return
    # a lone record is late only by the last hop's own latency
    last_latency = lat[len(hops) - 1] if len(hops) <= len(lat) else 0
    assert arrival - delay <= last_latency


@given(tier_sets, st.integers(min_value=1, max_value=50_000_000))
def test_each_hop_is_the_largest_tier_that_fits_the_time_left(tiers: Tiers, delay: int) -> None:
    hops, _ = travel(tiers, delay, [])
    elapsed = 0
    for hop in hops:
        remaining = delay - elapsed
        fitting = [t.delay_ms for t in tiers.tiers if t.delay_ms <= remaining]
        assert hop.delay_ms == (max(fitting) if fitting else tiers.smallest_ms)
        # every hop but a last stretch shorter than the smallest tier ends by the due time
        assert hop.delay_ms <= remaining or hop is hops[-1]
        elapsed += min(hop.delay_ms, remaining)
    largest = tiers.tiers[-1].delay_ms
    # a timing wheel: the number of hops grows with delay / largest tier, not delay / smallest
    assert len(hops) <= delay // largest + sum(
        -(-bigger.delay_ms // smaller.delay_ms)
        for smaller, bigger in zip(tiers.tiers, tiers.tiers[1:], strict=False)) + 1


written_runs = st.lists(st.tuples(st.integers(min_value=0, max_value=3_000),
                                  st.integers(min_value=1, max_value=20_000)),
                        min_size=1, max_size=30)


@given(tier_sets, written_runs, st.integers(min_value=1, max_value=200))
def test_one_partition_releases_each_record_between_its_hop_due_and_one_smallest_tier_late(
        tiers: Tiers, gaps_and_remaining: list[tuple[int, int]], tick: int) -> None:
    # Records land on the smallest tier's partition in write order (time rising), each with
    # the time its final due lies after its write; the service polls every `tick` ms.
    smallest = tiers.smallest_ms
    written, finals, dues = [], [], []
    now = 0
    for gap, remaining in gaps_and_remaining:
        now += gap
        if tiers.next_hop(remaining) is not tiers.tiers[0]:
            remaining = min(remaining, smallest)  # only records that go to the smallest tier
        written.append(now)
        finals.append(now + remaining)
        dues.append(hop_due(now, smallest, now + remaining))
    released: list[int] = []
    clock = 0
    while len(released) < len(dues):
        clock += tick
        visible = [d for d, w in zip(dues, written, strict=True) if w <= clock]
        admission = gate.admit(visible[len(released):], clock)
        released.extend([clock] * admission.count)
    for at, due, write, final in zip(released, dues, written, finals, strict=True):
        assert at >= due  # never before the gate allows
        if at >= final:  # delivered to its target now: late by less than the bound
            assert at - final < smallest + tick
        assert at < write + smallest + tick  # the documented bound: smallest tier + latency


def test_default_tiers_and_topic_names() -> None:
    assert DEFAULT_TIERS.topics == ["redrive.delay.1s", "redrive.delay.10s", "redrive.delay.1m",
                                    "redrive.delay.10m", "redrive.delay.1h"]
    assert DEFAULT_TIERS.dead_letter == "redrive.delay.dlt"
    tiers = Tiers.parse("5s, 100ms,1s", prefix="app.delay")
    assert tiers.topics == ["app.delay.100ms", "app.delay.1s", "app.delay.5s"]
    assert tiers.smallest_ms == 100
    assert tiers.by_topic("app.delay.1s") == Tier("app.delay.1s", 1000)


@pytest.mark.parametrize(("durations", "field", "fragment"), [
    ([], "tiers", "at least one"),
    (["1s", "1000ms"], "tier", "given twice"),
    (["0s"], "tier", "longer than 0"),
    (["soon"], "tier", "'soon'"),
    ("15", "tiers", "Tiers.parse"),  # not tiers of 1 s and 5 s
])
def test_bad_tiers_name_the_field_and_value(durations: list[str] | str, field: str,
                                            fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Tiers.of(durations)
    assert caught.value.field == field
    assert fragment in str(caught.value)


def test_bad_prefix_and_unknown_tier_topic_are_named() -> None:
    with pytest.raises(InvalidArgument, match="'bad prefix'"):
        Tiers.of(["1s"], prefix="bad prefix")
    with pytest.raises(InvalidArgument, match="'nope'"):
        DEFAULT_TIERS.by_topic("nope")
    with pytest.raises(InvalidArgument, match="'1s,,5s'"):
        Tiers.parse("1s,,5s")


def test_due_time_from_delay_or_at() -> None:
    assert due_ms_of("1500ms", None, 1_000) == 2_500
    assert due_ms_of(timedelta(seconds=2), None, 1_000) == 3_000
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert due_ms_of(None, at, 0) == int(at.timestamp() * 1000)
    assert due_ms_of(None, 1_795_882_307_000, 1_000) == 1_795_882_307_000
    with pytest.raises(InvalidArgument, match=r"invalid at=1795882307: .*epoch seconds\?"):
        due_ms_of(None, 1_795_882_307, 1_000)  # seconds would be January 1970 in ms: due at once
    with pytest.raises(InvalidArgument, match=r"invalid at=253402300800000: .*year 9999"):
        due_ms_of(None, 253_402_300_800_000, 0)
    with pytest.raises(InvalidArgument, match="invalid delay='3000000d': ends past the year 9999"):
        due_ms_of("3000000d", None, 1_795_882_307_000)
    with pytest.raises(InvalidArgument, match="exactly one"):
        due_ms_of("1s", 5, 0)
    with pytest.raises(InvalidArgument, match="exactly one"):
        due_ms_of(None, None, 0)
    with pytest.raises(InvalidArgument, match="time zone"):
        due_ms_of(None, datetime(2030, 1, 1), 0)
    with pytest.raises(InvalidArgument, match="invalid at=-5"):
        due_ms_of(None, -5, 0)
    with pytest.raises(InvalidArgument, match="invalid delay='-1s'"):
        due_ms_of("-1s", None, 0)
    # An aware datetime out of the header's range: before 1970 is due at once, as any past
    # moment, with a due time redrive reads (it wrote a negative one, then dead-lettered it as
    # malformed); past 9999 in UTC is refused like the other forms.
    assert due_ms_of(None, datetime(1925, 7, 22, tzinfo=UTC), 1_000) == 0
    with pytest.raises(InvalidArgument, match=r"invalid at=.*year 9999"):
        due_ms_of(None, datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))), 0)


def test_target_must_be_a_legal_topic_outside_the_service() -> None:
    assert check_target("orders", DEFAULT_TIERS) == "orders"
    with pytest.raises(InvalidArgument, match="own topics"):
        check_target("redrive.delay.1m", DEFAULT_TIERS)
    with pytest.raises(InvalidArgument, match="own topics"):
        check_target("redrive.delay.dlt", DEFAULT_TIERS)
    with pytest.raises(InvalidArgument, match="target_topic"):
        check_target("no spaces", DEFAULT_TIERS)


def test_tier_topics_of_another_set_with_the_prefix_are_found_by_their_delay() -> None:
    tiers = Tiers.of(["1s", "1m"], prefix="p.delay")
    existing = ["p.delay.1s", "p.delay.10s", "p.delay.1500ms", "p.delay.2h", "p.delay.dlt",
                "p.delay.1m", "p.delay.10s.retry", "p.delay.0s", "q.delay.10s", "p.delays.5s",
                "orders"]
    assert tiers.named_on(existing) == {"p.delay.10s": Tier("p.delay.10s", 10_000),
                                        "p.delay.1500ms": Tier("p.delay.1500ms", 1_500),
                                        "p.delay.2h": Tier("p.delay.2h", 7_200_000)}
