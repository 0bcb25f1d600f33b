"""Reading the dead-letter header sets of redrive, Spring Kafka, Kafka Connect and Kafka Streams."""

from __future__ import annotations

import struct

from redrive import headers as h
from redrive.dead_letter_headers import header_sets, header_text, read_dead_letter
from redrive.record import Origin


def test_reads_redrive_dead_letters() -> None:
    written = h.replace([], {h.ATTEMPT: 4, h.GROUP: "billing", h.REASON: "exhausted",
                             h.ERROR_TYPE: "ValueError", h.ERROR_MESSAGE: "bad",
                             **h.origin_fields(Origin("orders", 1, 7, 99))})
    info = read_dead_letter(written)
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
    info = read_dead_letter(pairs)
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
    info = read_dead_letter(pairs)
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
    info = read_dead_letter(pairs)
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
    info = read_dead_letter(pairs)
    assert info is not None and info.system == "streams"
    assert info.original == Origin("metrics", 1, 77, None)
    assert info.error_message == "Size of data received is not 8"


def test_plain_record_has_no_dead_letter_story() -> None:
    assert read_dead_letter([("traceparent", b"x")]) is None


def test_reads_a_share_groups_dead_letter_queue_headers() -> None:
    pairs = [
        ("__dlq.errors.topic", b"orders"),
        ("__dlq.errors.partition", b"3"),
        ("__dlq.errors.offset", b"5120"),
        ("__dlq.errors.group", b"fulfilment"),
        ("__dlq.errors.delivery.count", b"5"),
        ("__dlq.errors.message", b"delivery count exhausted"),
    ]
    info = read_dead_letter(pairs)
    assert info is not None and info.system == "share-group"
    assert info.original == Origin("orders", 3, 5120, None)
    assert (info.group, info.attempts, info.error_message, info.error_type) == \
        ("fulfilment", 5, "delivery count exhausted", None)


def test_reads_karafkas_dead_letter_headers() -> None:
    pairs = [
        ("source_topic", b"payments"),
        ("source_partition", b"0"),
        ("source_offset", b"88"),
        ("source_consumer_group", b"ledger"),
    ]
    info = read_dead_letter(pairs)
    assert info is not None and info.system == "karafka"
    assert (info.original, info.group) == (Origin("payments", 0, 88, None), "ledger")


def test_a_record_with_several_sets_is_read_by_the_first_and_lists_them_all() -> None:
    pairs = h.replace([("source_topic", b"payments")], {
        h.REASON: "exhausted", h.ERROR_TYPE: "ValueError",
        **h.origin_fields(Origin("orders", 1, 7, 99))})
    pairs.append(("kafka_dlt-original-topic", b"orders"))
    info = read_dead_letter(pairs)
    assert info is not None and info.system == "redrive"
    assert header_sets(pairs) == ("redrive", "spring", "karafka")
    assert header_sets([(h.REASON, b"exhausted"), (h.ATTEMPT, b"x")]) == ("redrive",)  # unreadable
    assert header_sets([("traceparent", b"x")]) == ()


def test_springs_binary_numbers_are_shown_as_numbers() -> None:
    assert header_text("kafka_dlt-original-offset", struct.pack(">q", 12345)) == "12345"
    assert header_text("kafka_dlt-original-partition", struct.pack(">i", 2)) == "2"
    assert header_text("retry_topic-attempts", struct.pack(">i", 3)) == "3"
    # a text value of another length, or another header, is shown as text
    assert header_text("kafka_dlt-original-offset", b"12") == "12"
    assert header_text("redrive-attempt", b"\x00\x00\x00\x03") == "\x00\x00\x00\x03"
    assert header_text("x", b"\xff") == "\\xff"


def test_a_number_longer_than_any_system_writes_is_left_out() -> None:
    info = read_dead_letter([("__connect.errors.topic", b"t"),
                             ("__connect.errors.partition", b"1" * 5000),
                             ("__connect.errors.offset", b"1")])
    # Read as the set it is, its origin unknown (int() raised on text of 5,000 digits).
    assert info is not None and (info.system, info.original) == ("connect", None)
