"""Decoding, filtering and showing dead-letter records, without a broker."""

from __future__ import annotations

import json

import pytest

from redrive import headers as h
from redrive.errors import InvalidArgument
from redrive.ops.deadletters import (
    DeadLetterFilter,
    DeadLetterRecord,
    make_filter,
    parse_coordinates,
    parse_time,
)
from redrive.record import Record

NOW = 1_800_000_000_000


def redrive_letter(offset: int = 7, *, key: bytes | None = b"k1", reason: str = "exhausted",
                   error_type: str = "shop.errors.Timeout", timestamp_ms: int = NOW - 90_000,
                   extra: list[tuple[str, bytes]] | None = None) -> DeadLetterRecord:
    headers = [("trace-id", b"abc"), (h.ATTEMPT, b"3"), (h.GROUP, b"billing"),
               (h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"2"),
               (h.ORIGINAL_OFFSET, b"41"), (h.ERROR_TYPE, error_type.encode()),
               (h.ERROR_MESSAGE, b"upstream\ntimed out"), (h.ERROR_TRACE, b"Traceback\n  line 1"),
               (h.REASON, reason.encode()), *(extra or [])]
    return DeadLetterRecord.of(Record("orders.billing.dlt", 2, offset, timestamp_ms, key, b"{}",
                                      headers))


def test_redrive_letter_is_decoded() -> None:
    record = redrive_letter()
    assert record.problem is None
    assert (record.system, record.reason, record.error_type) == \
        ("redrive", "exhausted", "shop.errors.Timeout")
    assert record.to_json(NOW)["original"] == {"topic": "orders", "partition": 2, "offset": 41,
                                               "timestamp_ms": None}


def test_unreadable_redrive_headers_are_flagged_not_raised() -> None:
    record = DeadLetterRecord.of(Record("x.dlt", 0, 3, NOW, None, b"v",
                                        [(h.REASON, b"exhausted"), (h.ATTEMPT, b"three")]))
    assert record.info is None
    assert record.problem is not None and "redrive-attempt" in record.problem
    assert record.to_json(NOW)["problem"] == record.problem


def test_full_json_has_every_header_and_the_trace() -> None:
    full = redrive_letter().to_json(NOW, full=True)
    assert ["trace-id", "abc"] in full["headers"]
    assert full["error_trace"] == "Traceback\n  line 1"
    json.dumps(full)


def test_non_utf8_bytes_are_shown_escaped() -> None:
    record = DeadLetterRecord.of(Record("t", 0, 0, NOW, b"\xff\x00", b"\xfe",
                                        [("bin", b"\x80")]))
    shown = record.to_json(NOW, full=True)
    assert shown["key"] == "\\xff\x00"
    assert shown["headers"] == [["bin", "\\x80"]]


@pytest.mark.parametrize(("selection", "expected"), [
    (DeadLetterFilter(), [1, 2, 3, 4]),
    (DeadLetterFilter(reasons=frozenset({"not-retryable"})), [2]),
    (DeadLetterFilter(error_types=frozenset({"Timeout"})), [1, 3, 4]),
    (DeadLetterFilter(error_types=frozenset({"shop.errors.Timeout"})), [1, 3, 4]),
    (DeadLetterFilter(error_types=frozenset({"errors.Timeout"})), []),
    (DeadLetterFilter(keys=frozenset({"k2"})), [2]),
    (DeadLetterFilter(headers=(("tenant", "acme"),)), [3]),
    (DeadLetterFilter(headers=(("tenant", "acme"), ("trace-id", "abc"))), [3]),
    (DeadLetterFilter(since_ms=NOW - 60_000), [3, 4]),
    (DeadLetterFilter(until_ms=NOW - 60_000), [1, 2]),
    (DeadLetterFilter(partitions=frozenset({2}), coordinates=frozenset({(2, 4)})), [4]),
    (DeadLetterFilter(reasons=frozenset({"exhausted"}), since_ms=NOW - 60_000,
            headers=(("tenant", "acme"),)), [3]),
])
def test_filters(selection: DeadLetterFilter, expected: list[int]) -> None:
    records = [
        redrive_letter(1, timestamp_ms=NOW - 120_000),
        redrive_letter(2, key=b"k2", reason="not-retryable", error_type="ValueError",
                       timestamp_ms=NOW - 90_000),
        redrive_letter(3, timestamp_ms=NOW - 30_000, extra=[("tenant", b"acme")]),
        redrive_letter(4, timestamp_ms=NOW - 10_000, extra=[("tenant", b"other")]),
    ]
    assert [r.record.offset for r in records if selection.matches(r)] == expected


def test_make_filter_parses_what_users_type() -> None:
    at = 1795341600000 + 3_600_000
    selection = make_filter(reasons=["exhausted"], since="2h", until="2026-11-22T10:00:00Z",
                            headers=["tenant=acme", "empty="], at_ms=at)
    assert selection.since_ms == at - 7_200_000
    assert selection.until_ms == 1795341600000
    assert selection.headers == (("tenant", "acme"), ("empty", ""))


def test_times() -> None:
    assert parse_time("30m", "since", NOW) == NOW - 1_800_000
    assert parse_time("2026-11-22T10:00:00", "since", NOW) == 1795341600000  # naive is UTC
    assert parse_time("2026-11-22T11:00:00+01:00", "since", NOW) == 1795341600000
    with pytest.raises(InvalidArgument, match="since='yesterday'"):
        parse_time("yesterday", "since", NOW)
    assert parse_time("86400", "since", NOW) == NOW - 86_400_000  # seconds back
    # A moment as epoch seconds or ms, read as seconds back, selected everything since 1970.
    for epoch in ("1795341600", "1795341600000"):
        with pytest.raises(InvalidArgument, match=f"since='{epoch}': a bare number is seconds "
                           "back from now, and this reaches before 1973"):
            parse_time(epoch, "since", NOW)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"headers": ["tenant"]}, "header"),
    ({"headers": ["=acme"]}, "header"),
    ({"since": "1h", "until": "2h"}, "since"),
    ({"partitions": [-1]}, "partition"),
    ({"reasons": ["exhaused"]}, "reason"),  # a typo would select nothing, silently
])
def test_bad_filters_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"invalid {field}="):
        make_filter(**kwargs)  # type: ignore[arg-type]


def test_coordinates() -> None:
    assert parse_coordinates("3:1200") == (3, 1200)
    for bad in ("3", "a:1", "1:-2", "", "²:1", "1:³"):
        with pytest.raises(InvalidArgument, match="PARTITION:OFFSET"):
            parse_coordinates(bad)


@pytest.mark.parametrize(("selection", "partition", "expected"), [
    (DeadLetterFilter(), 0, (5, 20)),
    (DeadLetterFilter(partitions=frozenset({1})), 0, None),
    (DeadLetterFilter(coordinates=frozenset({(0, 9), (0, 12), (1, 3)})), 0, (9, 13)),
    (DeadLetterFilter(coordinates=frozenset({(1, 3)})), 0, None),
    (DeadLetterFilter(coordinates=frozenset({(0, 2)})), 0, None),  # below the start: gone
    (DeadLetterFilter(coordinates=frozenset({(0, 4), (0, 30)})), 0, (5, 20)),
])
def test_named_records_are_read_from_their_own_offsets(
        selection: DeadLetterFilter, partition: int, expected: tuple[int, int] | None) -> None:
    assert selection.offsets(partition, 5, 20) == expected


def test_an_error_type_selects_a_spring_letter_by_its_error_or_that_errors_cause() -> None:
    # A wrapper exception whose cause is the listener's own.
    letter = DeadLetterRecord.of(Record("orders-dlt", 0, 5, NOW, b"k", b"{}", [
        ("kafka_dlt-original-topic", b"orders"),
        ("kafka_dlt-exception-fqcn",
         b"org.springframework.kafka.listener.ListenerExecutionFailedException"),
        ("kafka_dlt-exception-cause-fqcn", b"com.shop.ParseError")]))
    assert letter.error_type == \
        "org.springframework.kafka.listener.ListenerExecutionFailedException"
    for wanted in ("ParseError", "com.shop.ParseError", "ListenerExecutionFailedException"):
        assert make_filter(error_types=[wanted]).matches(letter), wanted
    assert not make_filter(error_types=["TimeoutError"]).matches(letter)
