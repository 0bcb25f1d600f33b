import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import headers as h
from redrive import kafka
from redrive.errors import MalformedHeader
from redrive.record import Delivery, ErrorInfo, Origin

foreign = st.lists(
    st.tuples(st.text(min_size=1, max_size=20).filter(lambda n: not n.startswith(h.PREFIX)),
              st.binary(max_size=64)),
    max_size=10)


@given(foreign, st.integers(min_value=0, max_value=100), st.integers(min_value=1, max_value=2**62),
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
        [("a", b"1"), ("b", b""), ("c", b"t")]
    assert h.normalize(None) == []


def test_consumed_headers_with_a_null_value_get_empty_bytes() -> None:
    pairs = [("a", b"1"), ("b", None)]
    assert kafka.normalize_headers(pairs) == [("a", b"1"), ("b", b"")]
    clean = [("a", b"1")]
    assert kafka.normalize_headers(clean) is clean  # nothing to convert, nothing copied
    assert kafka.normalize_headers(None) == []


def test_reads_redrive_dead_letters() -> None:
    written = h.replace([], {h.ATTEMPT: 4, h.GROUP: "billing", h.REASON: "exhausted",
                             h.ERROR_TYPE: "ValueError", h.ERROR_MESSAGE: "bad",
                             **h.origin_fields(Origin("orders", 1, 7, 99))})
    info = h.read_dead_letter(written)
    assert info is not None
    assert (info.system, info.original, info.error_type, info.attempts, info.reason) == \
        ("redrive", Origin("orders", 1, 7, 99), "ValueError", 4, "exhausted")


def test_reads_spring_dlt_headers_with_binary_numbers() -> None:
    pairs = [
        ("kafka_dlt-original-topic", b"orders"),
        ("kafka_dlt-original-partition", struct.pack(">i", 2)),
        ("kafka_dlt-original-offset", struct.pack(">q", 12345)),
        ("kafka_dlt-original-timestamp", struct.pack(">q", 1_700_000_000_000)),
        ("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-exception-message", b"no"),
        ("kafka_dlt-exception-stacktrace", b"at x"),
        ("kafka_dlt-original-consumer-group", b"billing"),
    ]
    info = h.read_dead_letter(pairs)
    assert info is not None
    assert info.system == "spring"
    assert info.original == Origin("orders", 2, 12345, 1_700_000_000_000)
    assert (info.error_type, info.error_message, info.group) == \
        ("java.lang.IllegalStateException", "no", "billing")


def test_reads_spring_retry_topic_headers() -> None:
    pairs = [
        ("kafka_original-topic", b"payments"),
        ("kafka_original-partition", struct.pack(">i", 0)),
        ("kafka_original-offset", struct.pack(">q", 9)),
        ("kafka_exception-fqcn", b"com.acme.Boom"),
        ("kafka_exception-message", b"boom"),
        ("retry_topic-attempts", struct.pack(">i", 3)),
    ]
    info = h.read_dead_letter(pairs)
    assert info is not None and info.system == "spring"
    assert info.original == Origin("payments", 0, 9, None)
    assert (info.error_type, info.attempts) == ("com.acme.Boom", 3)


def test_reads_kafka_connect_headers() -> None:
    pairs = [
        ("__connect.errors.topic", b"clicks"),
        ("__connect.errors.partition", b"4"),
        ("__connect.errors.offset", b"1001"),
        ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors.DataException"),
        ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data failed"),
        ("__connect.errors.exception.stacktrace", b"trace"),
    ]
    info = h.read_dead_letter(pairs)
    assert info is not None and info.system == "connect"
    assert info.original == Origin("clicks", 4, 1001, None)
    assert info.error_type == "org.apache.kafka.connect.errors.DataException"


def test_reads_kafka_streams_headers() -> None:
    pairs = [
        ("__streams.errors.exception", b"org.apache.kafka.common.errors.SerializationException"),
        ("__streams.errors.message", b"Size of data received is not 8"),
        ("__streams.errors.stacktrace", b"trace"),
        ("__streams.errors.topic", b"metrics"),
        ("__streams.errors.partition", b"1"),
        ("__streams.errors.offset", b"77"),
    ]
    info = h.read_dead_letter(pairs)
    assert info is not None and info.system == "streams"
    assert info.original == Origin("metrics", 1, 77, None)
    assert info.error_message == "Size of data received is not 8"


def test_plain_record_has_no_dead_letter_story() -> None:
    assert h.read_dead_letter([("traceparent", b"x")]) is None
