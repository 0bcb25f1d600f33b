import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import headers as h
from redrive.dead_letter_headers import read_dead_letter
from redrive.errors import InvalidPolicy, MalformedHeader
from redrive.policy import Backoff, RetryPolicy
from redrive.record import ErrorInfo, Origin, Record
from redrive.routing import DeadLetter, Retry, route

NOW = 1_700_000_000_000
POLICY = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m,30m,30m,1h"), not_retryable=ValueError)


def fresh(headers: list[tuple[str, bytes]] | None = None) -> Record:
    return Record("orders", 2, 41, NOW - 5_000, b"key", b"value",
                  headers if headers is not None else [("traceparent", b"\x00\xff")])


def follow(record: Record, copy: Retry | DeadLetter, topic: str, offset: int) -> Record:
    return Record(topic, 0, offset, NOW, record.key, record.value, copy.headers)


def test_first_failure_goes_to_first_retry_topic() -> None:
    decision = route(fresh(), RuntimeError("down"), POLICY, NOW, group="billing")
    assert isinstance(decision, Retry)
    assert decision.topic == "orders.billing.retry.5m"
    assert decision.due_ms == NOW + 300_000
    assert decision.partition == 2
    delivery = h.read_delivery(decision.headers)
    assert delivery.attempt == 1
    assert delivery.first_failure_ms == NOW
    assert delivery.group == "billing"
    assert delivery.original == Origin("orders", 2, 41, NOW - 5_000)
    assert h.last(decision.headers, h.ERROR_TYPE) == b"RuntimeError"
    assert h.last(decision.headers, h.ERROR_MESSAGE) == b"down"
    assert b"RuntimeError: down" in (h.last(decision.headers, h.ERROR_TRACE) or b"")
    assert decision.headers[0] == ("traceparent", b"\x00\xff")


def test_later_failures_walk_the_sequence_and_keep_the_origin() -> None:
    record, expected = fresh(), ["5m", "5m", "30m", "30m", "30m", "1h"]
    now = NOW
    for number, delay in enumerate(expected, start=1):
        decision = route(record, TimeoutError("slow"), POLICY, now, group="billing")
        assert isinstance(decision, Retry), number
        assert decision.topic == f"orders.billing.retry.{delay}"
        assert decision.attempt == number
        delivery = h.read_delivery(decision.headers)
        assert delivery.first_failure_ms == NOW
        assert delivery.original == Origin("orders", 2, 41, NOW - 5_000)
        assert decision.due_ms == now + POLICY.backoff.delay_ms(number)
        now = decision.due_ms + 10
        record = follow(record, decision, decision.topic, number)
    final = route(record, TimeoutError("slow"), POLICY, now, group="billing")
    assert isinstance(final, DeadLetter)
    assert (final.topic, final.reason, final.attempt) == ("orders.billing.dlt", "exhausted", 7)
    assert h.last(final.headers, h.REASON) == b"exhausted"
    assert h.last(final.headers, h.DUE) is None
    assert h.read_delivery(final.headers).original == Origin("orders", 2, 41, NOW - 5_000)


def test_not_retryable_goes_straight_to_dead_letter() -> None:
    decision = route(fresh(), ValueError("bad amount"), POLICY, NOW, group="billing")
    assert isinstance(decision, DeadLetter)
    assert (decision.topic, decision.reason, decision.attempt) == \
        ("orders.billing.dlt", "not-retryable", 1)
    assert h.last(decision.headers, h.ERROR_MESSAGE) == b"bad amount"


def test_deadline_passed() -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("10m"), attempts=10, max_retry_period="25m")
    record = fresh()
    first = route(record, RuntimeError(), policy, NOW, group="g")
    assert isinstance(first, Retry)
    second = route(follow(record, first, first.topic, 0), RuntimeError(), policy,
                   first.due_ms, group="g")
    assert isinstance(second, Retry)
    third = route(follow(record, second, second.topic, 1), RuntimeError(), policy,
                  second.due_ms, group="g")
    assert isinstance(third, DeadLetter)
    assert third.reason == "deadline" and third.attempt == 3


@pytest.mark.parametrize("bad", [[(h.ATTEMPT, b"x")], [(h.DUE, b"tomorrow")],
                                 [(h.ORIGINAL_TOPIC, b"orders")]])
def test_malformed_headers_are_dead_lettered_and_kept(bad: list[tuple[str, bytes]]) -> None:
    record = Record("orders.billing.retry.5m", 0, 8, NOW, b"k", b"v", [("user", b"1"), *bad])
    decision = route(record, RuntimeError("whatever"), POLICY, NOW, group="billing")
    assert isinstance(decision, DeadLetter)
    assert (decision.topic, decision.reason) == ("orders.billing.dlt", "malformed")
    name, value = bad[0]
    assert ("redrive-malformed-" + name[len(h.PREFIX):], value) in decision.headers
    h.validate(decision.headers)  # the dead letter's own redrive headers parse cleanly
    assert h.read_delivery(decision.headers).original == \
        Origin("orders.billing.retry.5m", 0, 8, NOW)
    assert h.last(decision.headers, h.ERROR_TYPE) == b"redrive.errors.MalformedHeader"
    assert ("user", b"1") in decision.headers


@pytest.mark.parametrize(("topic", "dead_letter"), [
    ("a.billing.retry.b", "a.billing.retry.b.billing.dlt"),  # a main topic named so
    ("a.billing.retry.b.billing.retry.5m", "a.billing.retry.b.billing.dlt"),
    ("orders.billing.retry.2", "orders.billing.dlt"),
])
def test_a_malformed_record_goes_to_its_own_main_topics_dead_letter_topic(
        topic: str, dead_letter: str) -> None:
    record = Record(topic, 0, 1, NOW, b"k", b"v", [(h.ATTEMPT, b"x")])
    decision = route(record, RuntimeError("whatever"), POLICY, NOW, group="billing")
    assert isinstance(decision, DeadLetter) and decision.reason == "malformed"
    assert decision.topic == dead_letter


def test_malformed_error_from_the_runtime_is_dead_lettered() -> None:
    decision = route(fresh(), MalformedHeader("x-schema", b"?", "unknown schema"), POLICY, NOW,
                     group="billing")
    assert isinstance(decision, DeadLetter) and decision.reason == "malformed"


def test_no_dead_letter_topic_drops_with_reason() -> None:
    policy = RetryPolicy(attempts=1, dead_letter=False)
    decision = route(fresh(), RuntimeError(), policy, NOW, group="g")
    assert isinstance(decision, DeadLetter)
    assert decision.topic is None and decision.reason == "exhausted"


def test_shipped_error_info_routes_like_the_exception() -> None:
    info = ErrorInfo.from_exception(ValueError("bad"))
    shipped = ErrorInfo(info.type_name, info.message, info.trace, info.chain)
    assert route(fresh(), shipped, POLICY, NOW, group="billing") == \
        route(fresh(), ValueError("bad"), POLICY, NOW, group="billing")


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=10**6))
def test_a_retry_is_never_due_before_its_delay(attempts_before: int, elapsed: int) -> None:
    policy = RetryPolicy(backoff=Backoff.exponential("1s", 2.0, "1m", jitter=0.5), attempts=10)
    headers = h.replace([], {h.ATTEMPT: attempts_before, h.FIRST_FAILURE: NOW,
                             **h.origin_fields(Origin("orders", 0, 1))})
    record = Record("orders.g.retry.1s", 0, 3, NOW, None, None, headers)
    now = NOW + elapsed
    decision = route(record, RuntimeError(), policy, now, group="g")
    if attempts_before + 1 >= 10:
        assert isinstance(decision, DeadLetter)
    else:
        assert isinstance(decision, Retry)
        assert decision.due_ms >= now + policy.backoff.nominal_ms(attempts_before + 1) * 0.5 - 1
        assert decision.due_ms > now
        assert h.read_due(decision.headers) == decision.due_ms


SPRING = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=2, header_format="spring")


def spring_number(headers: list[tuple[str, bytes]], name: str, fmt: str) -> int:
    raw = h.last(headers, name)
    assert raw is not None and len(raw) == struct.calcsize(fmt), (name, raw)
    number: int = struct.unpack(fmt, raw)[0]
    return number


def test_spring_format_writes_springs_dead_letter_headers_beside_redrives() -> None:
    def fail() -> None:
        try:
            raise KeyError("sku")
        except KeyError as cause:
            raise LookupError("no price for sku-7") from cause

    record = fresh()
    retry = route(record, TimeoutError("slow"), SPRING, NOW, group="billing")
    assert isinstance(retry, Retry)
    assert h.last(retry.headers, "kafka_dlt-original-topic") is None  # only dead letters
    again = follow(record, retry, retry.topic, 3)
    try:
        fail()
    except LookupError as error:
        dead = route(again, error, SPRING, NOW + 2_000, group="billing")
    assert isinstance(dead, DeadLetter) and dead.reason == "exhausted"
    headers = dead.headers
    assert h.last(headers, "kafka_dlt-original-topic") == b"orders"
    assert spring_number(headers, "kafka_dlt-original-partition", ">i") == 2
    assert spring_number(headers, "kafka_dlt-original-offset", ">q") == 41
    assert spring_number(headers, "kafka_dlt-original-timestamp", ">q") == NOW - 5_000
    assert h.last(headers, "kafka_dlt-original-consumer-group") == b"billing"
    assert h.last(headers, "kafka_dlt-exception-fqcn") == b"LookupError"
    assert h.last(headers, "kafka_dlt-exception-cause-fqcn") == b"KeyError"
    assert h.last(headers, "kafka_dlt-exception-message") == b"no price for sku-7"
    assert b"LookupError: no price for sku-7" in (h.last(headers, "kafka_dlt-exception-stacktrace")
                                                  or b"")
    # redrive's own story is all there, and read first
    assert h.last(headers, h.REASON) == b"exhausted"
    assert h.read_delivery(headers).original == Origin("orders", 2, 41, NOW - 5_000)
    # Spring's set alone tells the same story
    spring_only = [(name, value) for name, value in headers if not name.startswith(h.PREFIX)]
    info = read_dead_letter(spring_only)
    assert info is not None and info.system == "spring"
    assert (info.original, info.group, info.error_type) == \
        (Origin("orders", 2, 41, NOW - 5_000), "billing", "LookupError")


def test_spring_headers_of_an_earlier_dead_letter_are_replaced_not_repeated() -> None:
    first = route(fresh(), ValueError("bad"), RetryPolicy(not_retryable=ValueError,
                                                          header_format="spring"),
                  NOW, group="billing")
    replayed = Record("orders", 0, 99, NOW, b"key", b"value", first.headers)
    again = route(replayed, ValueError("worse"), RetryPolicy(not_retryable=ValueError,
                                                             header_format="spring"),
                  NOW, group="billing")
    names = [name for name, _ in again.headers]
    assert names.count("kafka_dlt-exception-message") == 1
    assert h.last(again.headers, "kafka_dlt-exception-message") == b"worse"
    # the replayed copy still names the original record, as redrive's own headers do
    assert spring_number(again.headers, "kafka_dlt-original-offset", ">q") == 41


def test_spring_format_on_a_malformed_record() -> None:
    record = fresh([(h.ATTEMPT, b"two")])
    dead = route(record, RuntimeError("x"), SPRING, NOW, group="billing")
    assert isinstance(dead, DeadLetter) and dead.reason == "malformed"
    assert spring_number(dead.headers, "kafka_dlt-original-offset", ">q") == 41
    assert h.last(dead.headers, "kafka_dlt-exception-fqcn") == b"redrive.errors.MalformedHeader"


def test_redrive_format_writes_no_spring_headers() -> None:
    dead = route(fresh(), ValueError("bad"), POLICY, NOW, group="billing")
    assert not [name for name, _ in dead.headers if name.startswith("kafka_")]


@pytest.mark.parametrize("value", ["java", "", None, 3])
def test_unknown_header_format_is_refused_naming_it(value: object) -> None:
    with pytest.raises(InvalidPolicy, match=r"header_format.*expected one of \['redrive', "
                                            r"'spring'\]") as caught:
        RetryPolicy(header_format=value)  # type: ignore[arg-type]
    assert repr(value) in str(caught.value)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise AttributeError("the message needs an attribute the error lacks")


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


@pytest.mark.parametrize(("error", "message"), [
    (UnprintableError("x"), "<str() of the error failed: AttributeError>"),
    (RuntimeError("bad \udcff byte"), "bad \\udcff byte"),  # from surrogateescape-decoded bytes
    (ValueError(b"\xff\xfe".decode("utf-8", "surrogateescape")), "\\udcff\\udcfe"),
])
@pytest.mark.parametrize("header_format", ["redrive", "spring"])
def test_an_error_whose_text_cannot_be_had_or_encoded_is_still_routed(
        error: Exception, message: str, header_format: str) -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=2, header_format=header_format)
    retry = route(fresh(), _raised(error), policy, NOW, group="billing")
    assert isinstance(retry, Retry)
    dead = route(follow(fresh(), retry, retry.topic, 0), _raised(error), policy, NOW,
                 group="billing")
    assert isinstance(dead, DeadLetter) and dead.reason == "exhausted"
    for decision in (retry, dead):
        texts = {name: value.decode("utf-8") for name, value in decision.headers
                 if name.startswith(h.PREFIX)}  # each one UTF-8 text, as the contract says
        assert texts[h.ERROR_MESSAGE] == message
        assert texts[h.ERROR_TRACE].endswith(f"{type(error).__name__}: {message}\n")
    assert read_dead_letter(dead.headers).error_message == message


# Any text, lone surrogates (which hypothesis's characters() seldom draws) among it.
ANY_TEXT = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)),
                    max_size=50).map("".join)


@given(ANY_TEXT)
def test_every_error_text_becomes_utf8_headers(text: str) -> None:
    info = ErrorInfo("Error", text, text)  # as a Spark batch function's error column gives it
    decision = route(fresh(), info, POLICY, NOW, group="billing")
    values = dict(decision.headers)
    assert values[h.ERROR_MESSAGE].decode("utf-8") == \
        text.encode("utf-8", "backslashreplace").decode("utf-8")
