"""A copy too large for its producer: the error text cut, the record whole, or a clear error."""

from __future__ import annotations

import pytest
from confluent_kafka import Message, Producer

from redrive import headers as h
from redrive import kafka
from redrive.dead_letter_headers import SPRING_EXCEPTION
from redrive.errors import RecordTooLarge
from redrive.kafka.records import record_size
from redrive.oversize import CUT_NOTE, MESSAGE_KEPT, slimmed


def _copy(trace: bytes = b"t" * 5000, message: bytes = "é".encode() * 300) -> kafka.OutRecord:
    return kafka.OutRecord("orders.g.dlt", b"v" * 100, b"k", [
        ("own", b"kept"),
        (h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"3"),
        (h.ORIGINAL_OFFSET, b"1042"),
        (h.ERROR_TYPE, b"ValueError"), (h.ERROR_MESSAGE, message), (h.ERROR_TRACE, trace),
        (SPRING_EXCEPTION + "message", message), (SPRING_EXCEPTION + "stacktrace", trace),
    ], 3, 17)


def test_a_slimmed_copy_keeps_the_record_and_cuts_only_the_error_text() -> None:
    copy = _copy()
    cut = slimmed(copy)
    assert (cut.topic, cut.key, cut.value, cut.partition, cut.timestamp_ms) == \
        (copy.topic, copy.key, copy.value, copy.partition, copy.timestamp_ms)
    values = dict(cut.headers)
    assert [name for name, _ in cut.headers] == [name for name, _ in copy.headers]
    assert values[h.ERROR_TRACE] == values[SPRING_EXCEPTION + "stacktrace"] == CUT_NOTE
    message = values[h.ERROR_MESSAGE].decode()  # still UTF-8: cut between characters
    assert message == "é" * ((MESSAGE_KEPT - 3) // 2) + "…"
    assert values[SPRING_EXCEPTION + "message"] == values[h.ERROR_MESSAGE]
    assert (values["own"], values[h.ERROR_TYPE]) == (b"kept", b"ValueError")
    assert record_size(copy) - record_size(cut) > 2 * 5000


def test_a_copy_with_nothing_left_to_cut_is_refused_naming_its_record() -> None:
    once = slimmed(_copy())
    with pytest.raises(RecordTooLarge) as refused:
        slimmed(once)
    assert refused.value.origin == "orders[3]@1042"
    assert refused.value.size == record_size(once)
    assert "the copy of orders[3]@1042 for topic 'orders.g.dlt'" in str(refused.value)
    assert "even with its error text cut" in str(refused.value)
    assert "message.max.bytes" in str(refused.value)


def test_a_short_message_is_kept_and_a_copy_without_error_text_is_refused() -> None:
    cut = slimmed(_copy(message=b"boom"))
    assert dict(cut.headers)[h.ERROR_MESSAGE] == b"boom"
    plain = kafka.OutRecord("t", b"v" * 10, None, [("own", b"x")])
    with pytest.raises(RecordTooLarge) as refused:
        slimmed(plain)
    assert refused.value.origin is None
    assert "a record for topic 't' carries 14 bytes" in str(refused.value)
    assert "even with" not in str(refused.value)


def test_a_null_or_short_trace_is_left_as_it_is() -> None:
    """Before, each was replaced by the note: a null one became text, a short one grew."""
    copy = _copy(trace=b"t" * 5000)
    copy = kafka.OutRecord(copy.topic, copy.value, copy.key, [
        *[(n, v) for n, v in copy.headers if n != SPRING_EXCEPTION + "stacktrace"],
        (SPRING_EXCEPTION + "stacktrace", None)], 3, 17)
    cut = dict(slimmed(copy).headers)
    assert cut[h.ERROR_TRACE] == CUT_NOTE and cut[SPRING_EXCEPTION + "stacktrace"] is None
    short = dict(slimmed(_copy(trace=b"short")).headers)
    assert short[h.ERROR_TRACE] == b"short"


def _small_producer(limit: int) -> Producer:
    # librdkafka checks message.max.bytes as produce() is called: no broker is needed.
    return Producer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": limit,
                     "log_level": 0})


def test_produce_sends_the_slimmed_copy_when_the_producer_refuses_the_whole_one() -> None:
    producer = _small_producer(3000)
    queued: list[int] = []  # sizes of the values queued (a delivery report has no headers)
    made: list[kafka.OutRecord] = []

    def on_delivery(err: object, msg: Message) -> None:
        queued.append(len(msg.value() or b""))

    def shrink(record: kafka.OutRecord) -> kafka.OutRecord:
        made.append(slimmed(record))
        return made[-1]

    copy = _copy(trace=b"t" * 4000, message=b"m" * 50)
    assert record_size(copy) > 3000 > record_size(slimmed(copy))
    kafka.produce(producer, copy, on_delivery, shrink=shrink)
    assert len(made) == 1
    assert dict(made[0].headers)[h.ERROR_TRACE] == CUT_NOTE
    assert dict(made[0].headers)[h.ERROR_MESSAGE] == b"m" * 50
    with pytest.raises(RecordTooLarge) as refused:
        kafka.produce(producer, copy, on_delivery)  # without shrink: refused, said as it is
    assert refused.value.topic == "orders.g.dlt"
    big_value = kafka.OutRecord("orders.g.dlt", b"v" * 5000, None,
                                [(h.ERROR_TRACE, b"t"), (h.ORIGINAL_TOPIC, b"orders"),
                                 (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"7")])
    with pytest.raises(RecordTooLarge) as refused:
        kafka.produce(producer, big_value, on_delivery, shrink=shrink)
    assert refused.value.origin == "orders[0]@7"
    assert len(made) == 1  # its one-byte trace left as it is: nothing to cut, refused at once
    producer.purge()  # what was queued is reported, as purged
    producer.flush(5)
    assert queued == [100]  # the slimmed copy alone
