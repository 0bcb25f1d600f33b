"""How the commands show things: a dead-letter record's summary line and detail, ages, tables."""

from __future__ import annotations

from redrive import headers as h
from redrive.cli.formatting import age, detail, iso, relative, summary_row, table
from redrive.ops.deadletters import DeadLetterRecord
from redrive.ops.web import _ms_time
from redrive.record import Record

NOW = 1_800_000_000_000


def redrive_letter() -> DeadLetterRecord:
    headers = [("trace-id", b"abc"), (h.ATTEMPT, b"3"), (h.GROUP, b"billing"),
               (h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"2"),
               (h.ORIGINAL_OFFSET, b"41"), (h.ERROR_TYPE, b"shop.errors.Timeout"),
               (h.ERROR_MESSAGE, b"upstream\ntimed out"), (h.ERROR_TRACE, b"Traceback\n  line 1"),
               (h.REASON, b"exhausted")]
    return DeadLetterRecord.of(Record("orders.billing.dlt", 2, 7, NOW - 90_000, b"k1", b"{}",
                                      headers))


def test_summary_row_of_a_redrive_letter() -> None:
    assert summary_row(redrive_letter(), NOW) == [
        "2:7", "k1", "1m30s", "exhausted", "redrive", "shop.errors.Timeout",
        "upstream timed out", 3, "orders[2]@41"]


def test_unreadable_headers_show_as_such() -> None:
    record = DeadLetterRecord.of(Record("x.dlt", 0, 3, NOW, None, b"v",
                                        [(h.REASON, b"exhausted"), (h.ATTEMPT, b"three")]))
    row = summary_row(record, NOW)
    assert row[3] == "UNREADABLE"
    assert "redrive-attempt" in str(row[6])
    text = detail(record, NOW)
    assert "UNREADABLE" in text and "redrive-attempt: three" in text


def test_detail_shows_every_header_and_the_trace() -> None:
    text = detail(redrive_letter(), NOW)
    assert "trace-id: abc" in text
    assert "original:   orders 2:41" in text
    assert text.rstrip().endswith("line 1")
    assert "trace:" in text


def test_ages() -> None:
    assert [age(ms) for ms in (250, 5_000, 61_000, 7_260_000, 90_000_000)] == \
        ["250ms", "5s", "1m01s", "2h01m", "1d01h"]
    assert relative(NOW + 5_000, NOW) == "in 5s"
    assert relative(NOW - 500, NOW) == "500ms ago"


def test_tables_align_columns_under_a_rule_and_show_none_as_empty() -> None:
    lines = table(["topic", "n", "z"], [["a", 1, None], ["bbbb", 22, "x"]]).splitlines()
    assert lines[0].split() == ["topic", "n", "z"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split() == ["a", "1"]
    assert lines[3].split() == ["bbbb", "22", "x"]
    assert lines[2].index("1") == lines[3].index("22") == lines[0].index("n")


def test_times_past_what_a_datetime_holds_are_shown_as_milliseconds() -> None:
    # A producer may stamp a record with any 64-bit time; `dlt show` must still show the record.
    assert iso(1_700_000_000_000) == "2023-11-14T22:13:20.000+00:00"
    assert iso(2**63 - 1) == "9223372036854775807 ms"
    assert iso(-(2**63)) == "-9223372036854775808 ms"
    assert _ms_time(2**63 - 1) == "9223372036854775807 ms"
    assert _ms_time(1_700_000_000_000) == "2023-11-14 22:13:20 UTC"


def test_control_characters_from_a_record_reach_the_terminal_written_out() -> None:
    # A clear screen, a new terminal title and a carriage return that would overwrite the line.
    hostile = "\x1b[2J\x1b]0;pwned\x07ok\rfake"
    headers = [(h.REASON, b"exhausted"), (h.ERROR_MESSAGE, hostile.encode()),
               (h.ERROR_TRACE, f"Traceback\n  {hostile}".encode()), ("note", b"a\x9bb")]
    letter = DeadLetterRecord.of(Record("x.dlt", 0, 3, NOW, hostile.encode(), b"v\nreason: ok",
                                        headers))
    listed = table(["key", "message"], [summary_row(letter, NOW)[1::5]])
    shown = detail(letter, NOW)
    for text in (listed, shown):
        assert not any(ch in text for ch in "\x1b\x07\r\x9b"), text
        assert "\\x1b[2J\\x1b]0;pwned\\x07ok\\rfake" in text
    assert "value:      v\\nreason: ok" in shown  # not a line of its own
    assert "note: a\\x9bb" in shown
    assert shown.splitlines()[-1] == "    \\x1b[2J\\x1b]0;pwned\\x07ok\\rfake"  # the trace's line
