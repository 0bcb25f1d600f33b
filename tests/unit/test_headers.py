
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import headers as h
from redrive.errors import InvalidArgument, MalformedHeader
from redrive.record import Delivery, ErrorInfo, Origin

foreign = st.lists(
    st.tuples(st.text(min_size=1, max_size=20).filter(lambda n: not n.startswith(h.PREFIX)),
              st.binary(max_size=64)),
    max_size=10)


@given(foreign, st.integers(min_value=0, max_value=100),
       st.integers(min_value=1, max_value=h.MAX_TIME_MS),
       st.text(min_size=1, max_size=30).filter(lambda t: t.strip() != ""))
def test_round_trip_keeps_other_headers_untouched(others: list[tuple[str, bytes]], attempt: int,
                                                  due: int, group: str) -> None:
    origin = Origin("orders", 3, 42, 1_700_000_000_000)
    written = h.replace(others, {h.ATTEMPT: attempt, h.DUE: due, h.GROUP: group,
                                 h.FIRST_FAILURE: due - 1, **h.origin_fields(origin)})
    assert [pair for pair in written if not pair[0].startswith(h.PREFIX)] == others
    delivery = h.read_delivery(written)
    assert delivery == Delivery(attempt=attempt, first_failure_ms=due - 1, group=group,
                                original=origin, due_ms=due)


def test_values_are_decimal_utf8_text() -> None:
    written = h.replace([], {h.ATTEMPT: 2, h.DUE: 1_700_000_000_123, h.GROUP: "billing"})
    assert written == [(h.ATTEMPT, b"2"), (h.DUE, b"1700000000123"), (h.GROUP, b"billing")]


def test_replace_drops_old_values_and_none_removes() -> None:
    written = h.replace([(h.ATTEMPT, b"1"), ("x", b"1"), (h.DUE, b"5")],
                        {h.ATTEMPT: 2, h.DUE: None})
    assert written == [("x", b"1"), (h.ATTEMPT, b"2")]


def test_last_value_wins() -> None:
    assert h.read_delivery([(h.ATTEMPT, b"1"), (h.ATTEMPT, b"3")]).attempt == 3


def test_a_record_never_failed_has_an_empty_delivery() -> None:
    assert h.read_delivery([("traceparent", b"00-abc")]) == Delivery()


@pytest.mark.parametrize(("pairs", "header"), [
    ([(h.ATTEMPT, b"two")], h.ATTEMPT),
    ([(h.ATTEMPT, b"-1")], h.ATTEMPT),
    ([(h.ATTEMPT, b"1_000")], h.ATTEMPT),  # int() takes it; the contract does not
    ([(h.DUE, b"9" * 5000)], h.DUE),  # beyond int64, and beyond what int() parses
    ([(h.ORIGINAL_OFFSET, "٣".encode()), (h.ORIGINAL_TOPIC, b"t"),
      (h.ORIGINAL_PARTITION, b"0")], h.ORIGINAL_OFFSET),
    ([(h.DUE, b"")], h.DUE),
    ([(h.DUE, b"--5")], h.DUE),  # int() refuses it: it must be named, not raised as ValueError
    ([(h.ATTEMPT, b" -")], h.ATTEMPT),
    ([(h.DUE, b"\xff\xfe")], h.DUE),
    ([(h.FIRST_FAILURE, b"12:00")], h.FIRST_FAILURE),
    ([(h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"0")], h.ORIGINAL_OFFSET),
    ([(h.ORIGINAL_TOPIC, b""), (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"1")],
     h.ORIGINAL_TOPIC),
    ([(h.GROUP, b"")], h.GROUP),
])
def test_malformed_headers_raise_one_error_type_naming_header_and_value(
        pairs: list[tuple[str, bytes]], header: str) -> None:
    with pytest.raises(MalformedHeader) as caught:
        h.validate(pairs)
    assert caught.value.header == header
    assert header in str(caught.value)


@pytest.mark.parametrize("read", [h.read_delivery, h.read_delivery_python, h.read_due])
@pytest.mark.parametrize("pairs", [
    [(h.DUE, None)],
    [(h.DUE, b"5"), (h.DUE, None)],  # the last value wins, null or not
    [(h.ATTEMPT, b"1"), (h.DUE, None), ("x", None)],
])
def test_a_null_value_of_a_redrive_header_is_named_null_not_empty(
        read: Any, pairs: list[tuple[str, bytes | None]]) -> None:
    with pytest.raises(MalformedHeader) as caught:
        read(pairs)
    assert (caught.value.header, caught.value.value) == (h.DUE, None)
    assert str(caught.value) == ("malformed header redrive-due=None: a null value (expected a "
                                 "decimal integer)")


def test_an_empty_value_is_still_named_empty() -> None:
    with pytest.raises(MalformedHeader, match=r"redrive-due=b'': expected a decimal integer"):
        h.read_delivery([(h.DUE, None), (h.DUE, b"")])
    with pytest.raises(MalformedHeader, match=r"redrive-group=None: a null value \(empty group"):
        h.read_delivery([(h.GROUP, None)])


def test_unknown_reason_is_malformed() -> None:
    with pytest.raises(MalformedHeader, match="redrive-reason"):
        h.validate([(h.REASON, b"bored")])


def test_error_fields_are_cut_at_character_boundaries() -> None:
    info = ErrorInfo("ValueError", "é" * 100, "x" * 50)
    fields = h.error_fields(info, message_limit=11, trace_limit=10)
    assert fields[h.ERROR_MESSAGE] == "é" * 5
    assert fields[h.ERROR_TRACE] == "x" * 10


def test_normalize_accepts_what_clients_hand_over() -> None:
    assert h.normalize([("a", bytearray(b"1")), ("b", None), ("c", "t")]) == \
        [("a", b"1"), ("b", None), ("c", b"t")]
    assert h.normalize(None) == []


def test_consumed_headers_keep_a_null_value_null_and_a_redrive_one_reads_as_empty() -> None:
    pairs: list[tuple[str, bytes | None]] = [("a", b"1"), ("b", None)]
    assert h.normalize(pairs) is pairs  # as consumed: nothing to convert, nothing copied
    assert h.normalize(None) == []
    assert h.last(pairs, "b") == b"" and h.last(pairs, "c") is None
    # Null is not a number: as malformed as an empty value, in C and in Python.
    for read in (h.read_delivery, h.read_delivery_python):
        with pytest.raises(MalformedHeader, match=h.ATTEMPT):
            read([(h.ATTEMPT, None)])


def test_a_header_value_that_is_not_bytes_str_or_none_is_refused_naming_the_header() -> None:
    # bytes(5) wrote five zero bytes.
    with pytest.raises(InvalidArgument, match=r"header 'n'.*5"):
        h.normalize([("a", b"x"), ("n", 5)])
    assert h.normalize([("a", bytearray(b"x")), ("b", "y"), ("c", None)]) == [
        ("a", b"x"), ("b", b"y"), ("c", None)]
