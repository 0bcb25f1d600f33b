import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import headers as h
from redrive.errors import MalformedHeader
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
