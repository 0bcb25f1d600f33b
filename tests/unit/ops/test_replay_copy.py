"""What a replayed copy carries, and what cannot be replayed; no broker needed."""

from __future__ import annotations

import pytest

from redrive import headers as h
from redrive.errors import InvalidArgument
from redrive.ops.deadletters import DeadLetterRecord
from redrive.ops.replay import (
    HISTORY,
    TO_ORIGINAL,
    TO_RETRY,
    Audit,
    Replayed,
    Target,
    _entry,
    log_key,
    parse_rate,
    prepare_copy,
    replays_of,
)
from redrive.record import Record

COUNTS = {"orders": 3, "orders.billing.retry.5s": 3, "small.retry": 1}


def letter(headers: list[tuple[str, bytes]]) -> DeadLetterRecord:
    return DeadLetterRecord.of(Record("orders.billing.dlt", 2, 9, 1, b"k", b"v", headers))


REDRIVE = [("trace-id", b"abc"), (h.ATTEMPT, b"3"), (h.GROUP, b"billing"),
           (h.FIRST_FAILURE, b"100"), (h.ORIGINAL_TOPIC, b"orders"),
           (h.ORIGINAL_PARTITION, b"2"), (h.ORIGINAL_OFFSET, b"41"),
           (h.ERROR_TYPE, b"Boom"), (h.REASON, b"exhausted")]


def test_reset_copy_to_the_retry_topic_is_due_now_with_a_fresh_budget() -> None:
    prepared = prepare_copy(letter(REDRIVE), TO_RETRY, "orders.billing.retry.5s", None, False,
                            COUNTS)
    assert not isinstance(prepared, str)
    target, headers = prepared
    assert target == Target("orders.billing.retry.5s", 2)
    delivery = h.read_delivery(headers)
    assert delivery.attempt == 0 and delivery.first_failure_ms is None
    assert delivery.group == "billing"
    assert delivery.original is not None and delivery.original.offset == 41
    assert delivery.due_ms is not None and delivery.due_ms > 1_700_000_000_000
    assert h.last(headers, h.REASON) is None
    assert h.last(headers, "trace-id") == b"abc"
    assert h.last(headers, h.ERROR_TYPE) == b"Boom"  # the last error stays, for the story


def test_kept_attempts_and_an_explicit_group() -> None:
    prepared = prepare_copy(letter(REDRIVE), TO_ORIGINAL, None, "audit", True, COUNTS)
    assert not isinstance(prepared, str)
    target, headers = prepared
    assert target == Target("orders", 2)
    delivery = h.read_delivery(headers)
    assert (delivery.attempt, delivery.first_failure_ms, delivery.group) == (3, 100, "audit")


def test_spring_letter_gets_redrive_origin_headers() -> None:
    spring = [("kafka_dlt-original-topic", b"orders"),
              ("kafka_dlt-original-partition", (2).to_bytes(4, "big")),
              ("kafka_dlt-original-offset", (41).to_bytes(8, "big")),
              ("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException")]
    prepared = prepare_copy(letter(spring), TO_RETRY, "small.retry", "billing", False, COUNTS)
    assert not isinstance(prepared, str)
    target, headers = prepared
    assert target == Target("small.retry", None)  # partition 2 does not exist there: by key
    delivery = h.read_delivery(headers)
    assert delivery.original is not None
    assert (delivery.original.topic, delivery.original.partition, delivery.original.offset) == \
        ("orders", 2, 41)


@pytest.mark.parametrize(("headers", "group", "why"), [
    ([(h.REASON, b"exhausted"), (h.ATTEMPT, b"x")], "g", "unreadable headers"),
    ([("__connect.errors.topic", b"orders"), ("__connect.errors.partition", b"1"),
      ("__connect.errors.offset", b"5")], None, "no group"),
    ([(h.REASON, b"exhausted"), (h.GROUP, b"g")], None, "no original"),
    ([("__connect.errors.topic", b"gone"), ("__connect.errors.partition", b"1"),
      ("__connect.errors.offset", b"5")], "g", "'gone' does not exist"),
])
def test_what_cannot_be_replayed_says_why(headers: list[tuple[str, bytes]], group: str | None,
                                          why: str) -> None:
    prepared = prepare_copy(letter(headers), TO_ORIGINAL, None, group, False, COUNTS)
    assert isinstance(prepared, str) and why in prepared


def test_rates() -> None:
    assert parse_rate(None) is None
    assert parse_rate("50") == 50.0
    assert parse_rate("50/s") == 50.0
    assert parse_rate("120/m") == 2.0
    assert parse_rate(2.5) == 2.5
    assert parse_rate("1/h") == 1 / 3600
    # Infinite sized no chunk, and a pause of 1e300 s overflowed the sleep: both mid-replay.
    for bad in ("0", "-1/s", "fast", "5/week", 0, "inf", "1e999/s", "nan", "1e-300/s", 1e-9):
        with pytest.raises(InvalidArgument, match="invalid rate="):
            parse_rate(bad)


def test_log_key_names_the_source() -> None:
    assert log_key("orders.billing.dlt", 2, 9) == "orders.billing.dlt/2/9"


def test_a_log_entry_keeps_its_records_earlier_replays_up_to_a_bound() -> None:
    record = letter(REDRIVE)
    entry = None
    for number in range(HISTORY + 5):
        copy = Replayed(("orders.billing.dlt", 2, 9), ("orders", 2, 100 + number), "k")
        entry = _entry(copy, record, Audit(f"r{number}", "me@host", TO_ORIGINAL, False),
                       1_000 + number, entry)
    assert entry is not None and entry["replays"] == HISTORY + 5
    shown = replays_of(entry)
    assert len(shown) == HISTORY + 1
    assert [r["replay_id"] for r in shown[:2]] == [f"r{HISTORY + 4}", f"r{HISTORY + 3}"]
    assert shown[-1]["replay_id"] == "r4"  # the oldest kept; r0..r3 are counted, not kept
    assert shown[0]["destination"] == {"topic": "orders", "partition": 2,
                                       "offset": 100 + HISTORY + 4}
    assert "history" not in shown[1]  # the history's entries do not nest


def test_a_first_replay_has_no_history() -> None:
    copy = Replayed(("orders.billing.dlt", 2, 9), ("orders", 2, 100), "k")
    entry = _entry(copy, letter(REDRIVE), Audit("r0", "me@host", TO_ORIGINAL, True), 1_000, None)
    assert "history" not in entry and "replays" not in entry
    assert replays_of(entry) == [{"replay_id": "r0", "who": "me@host", "when_ms": 1_000,
                                  "when": entry["when"], "to": TO_ORIGINAL, "attempts": "kept",
                                  "destination": {"topic": "orders", "partition": 2,
                                                  "offset": 100}}]
