import dataclasses
import pickle
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.errors import InvalidArgument, InvalidPolicy
from redrive.policy import (
    Backoff,
    DeadLetterLimit,
    Disposition,
    InPlace,
    Naming,
    RetryPolicy,
    error_type,
    format_ms,
    message_matches,
    predicate,
    to_ms,
)
from redrive.record import ErrorInfo, qualified_name


@pytest.mark.parametrize(("text", "ms"), [
    ("250ms", 250), ("5s", 5_000), ("5m", 300_000), ("1h", 3_600_000), ("1d", 86_400_000),
    ("1.5s", 1_500), (" 2m ", 120_000), ("30", 30_000), (2, 2_000), (0.25, 250),
    (timedelta(minutes=1), 60_000),
])
def test_durations_parse(text: object, ms: int) -> None:
    assert to_ms(text, "delay") == ms  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "5x", "-5s", "five", "5 m s", -1, float("nan"), True, None,
                                 1e306, "9" * 400 + "d"])
def test_bad_durations_name_field_and_value(bad: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        to_ms(bad, "backoff.delay")  # type: ignore[arg-type]
    assert caught.value.field == "backoff.delay"
    assert repr(bad) in str(caught.value)


@given(st.integers(min_value=0, max_value=10**12))
def test_format_round_trips(ms: int) -> None:
    assert to_ms(format_ms(ms)) == ms


def test_format_prefers_largest_exact_unit() -> None:
    assert [format_ms(ms) for ms in (250, 5_000, 300_000, 3_600_000, 86_400_000, 1_500, 90_000)] \
        == ["250ms", "5s", "5m", "1h", "1d", "1500ms", "90s"]


def test_fixed_backoff() -> None:
    backoff = Backoff.fixed("5s")
    assert [backoff.delay_ms(n) for n in (1, 2, 9)] == [5_000] * 3
    assert backoff.implied_attempts is None


def test_exponential_backoff_caps() -> None:
    backoff = Backoff.exponential(initial="1s", multiplier=2.0, max="1m")
    assert [backoff.delay_ms(n) for n in range(1, 9)] == \
        [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]


@given(st.integers(min_value=1, max_value=50), st.floats(min_value=0.0, max_value=0.99))
def test_exponential_jitter_stays_within_bounds(retry: int, jitter: float) -> None:
    backoff = Backoff.exponential(initial="1s", multiplier=2.0, max="1m", jitter=jitter)
    nominal = backoff.nominal_ms(retry)
    delay = backoff.delay_ms(retry)
    assert nominal * (1 - jitter) - 1 <= delay <= nominal * (1 + jitter) + 1


def test_sequence_implies_attempts() -> None:
    policy = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m,30m,30m,1h"))
    assert policy.max_attempts == 7
    assert policy.retry_delays_ms() == [300_000, 300_000, 1_800_000, 1_800_000, 1_800_000,
                                        3_600_000]


def test_attempts_count_the_first_delivery() -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=4)
    assert len(policy.retry_delays_ms()) == 3


def test_custom_backoff() -> None:
    policy = RetryPolicy(backoff=Backoff.custom(lambda n: f"{n * 10}s"), attempts=4)
    assert policy.retry_delays_ms() == [10_000, 20_000, 30_000]


@pytest.mark.parametrize(("make", "field"), [
    (lambda: RetryPolicy(attempts=0), "attempts"),
    (lambda: RetryPolicy(attempts=10**9), "attempts"),  # hours of checking, then of planning
    (lambda: RetryPolicy(attempts=2, backoff=Backoff.sequence("1s,2s")), "attempts"),
    (lambda: RetryPolicy(backoff="5s"), "backoff"),  # type: ignore[arg-type]
    (lambda: Backoff.exponential(initial="0s"), "backoff.initial"),
    (lambda: Backoff.exponential(multiplier=0.5), "backoff.multiplier"),
    (lambda: Backoff.exponential(initial="1m", max="1s"), "backoff.max"),
    (lambda: Backoff.exponential(jitter=1.5), "backoff.jitter"),
    (lambda: Backoff.exponential(jitter="x"), "backoff.jitter"),  # type: ignore[arg-type]
    (lambda: Backoff.exponential(multiplier="2"), "backoff.multiplier"),  # type: ignore[arg-type]
    (lambda: Backoff.custom("10s"), "backoff.custom"),  # type: ignore[arg-type]
    (lambda: RetryPolicy(not_retryable=42), "not_retryable"),  # type: ignore[arg-type]
    (lambda: Backoff.sequence(""), "backoff.sequence"),
    (lambda: Backoff.sequence("5s,,1m"), "backoff.sequence[1]"),
    (lambda: RetryPolicy(max_retry_period="0s"), "max_retry_period"),
    (lambda: RetryPolicy(naming="sideways"), "naming"),
    (lambda: RetryPolicy(retry_on=[42]), "retry_on"),  # type: ignore[list-item]
    (lambda: RetryPolicy(backoff=Backoff.custom(lambda n: "soon"), attempts=3),
     "backoff.custom(1)"),
    (lambda: InPlace(on=TimeoutError, retries=0), "in_place.retries"),
    (lambda: InPlace(on=TimeoutError, retries=3, backoff=Backoff.sequence("1s")),
     "in_place.retries"),
    (lambda: RetryPolicy(max_error_message_bytes=-1), "max_error_message_bytes"),
    (lambda: Backoff.exponential(multiplier=float("inf")), "backoff.multiplier"),
    (lambda: RetryPolicy(backoff=Backoff.exponential("1s", 10.0), attempts=400), "backoff(11)"),
    (lambda: InPlace(on=TimeoutError, retries=3, backoff=Backoff.exponential("1h", 100_000.0)),
     "in_place.backoff(3)"),
    # An in-place backoff's delays are checked when the policy is made, not when one is due.
    (lambda: InPlace(on=TimeoutError, backoff=Backoff.custom(lambda n: -5)),
     "backoff.custom(1)"),
])
def test_invalid_policies_fail_at_construction(make: object, field: str) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        make()  # type: ignore[operator]
    assert caught.value.field == field
    assert field in str(caught.value)


def test_a_capped_exponential_backoff_stays_at_its_cap_however_many_attempts() -> None:
    # Before the cap, 3.0**799 overflows a float.
    policy = RetryPolicy(backoff=Backoff.exponential("1s", 3.0, max="1h"), attempts=800)
    delays = policy.retry_delays_ms()
    assert (delays[0], delays[8], delays[-1]) == (1_000, 3_600_000, 3_600_000)


class TransientError(Exception):
    pass


class RateLimited(TransientError):
    pass


def test_dispositions_by_class_subclass_and_cause() -> None:
    policy = RetryPolicy(
        retry_on=[TransientError, ConnectionError],
        not_retryable=ValueError,
        in_place=InPlace(on=RateLimited, retries=2),
    )
    assert policy.disposition(TransientError()) is Disposition.RETRY
    assert policy.disposition(RateLimited()) is Disposition.IN_PLACE
    assert policy.disposition(ValueError()) is Disposition.DEAD_LETTER
    assert policy.disposition(KeyError()) is Disposition.DEAD_LETTER  # not in retry_on
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert policy.disposition(outer) is Disposition.RETRY


def test_cause_traversal_can_be_turned_off() -> None:
    matcher = error_type(ConnectionError, causes=False)
    try:
        raise RuntimeError("outer") from ConnectionError("inner")
    except RuntimeError as exc:
        assert not matcher(exc)
        assert error_type(ConnectionError)(exc)


def test_a_bare_type_name_matches_that_class_in_any_module_a_qualified_one_only_its_own() -> None:
    bare, qualified = error_type("ParseError"), error_type("app.errors.ParseError")
    for shipped_from in ("__main__.ParseError", "app.errors.ParseError", "ParseError"):
        assert bare(ErrorInfo(shipped_from, "cannot parse"))
    assert qualified(ErrorInfo("app.errors.ParseError", "cannot parse"))
    assert not qualified(ErrorInfo("__main__.ParseError", "cannot parse"))
    assert not bare(ErrorInfo("app.errors.ParseErrorX", "cannot parse"))
    assert not bare(ErrorInfo("ParseError.Other", "cannot parse"))


def test_not_retryable_wins_over_retry_on() -> None:
    policy = RetryPolicy(retry_on=Exception, not_retryable=KeyError)
    assert policy.disposition(KeyError("k")) is Disposition.DEAD_LETTER


def test_matchers_compose_and_work_on_shipped_errors() -> None:
    busy = message_matches(r"\b503\b") | predicate(lambda e: e.type_name.endswith("Timeout"))
    policy = RetryPolicy(retry_on=busy & ~error_type("builtins.KeyError"))
    shipped = ErrorInfo.from_exception(RuntimeError("HTTP 503 from upstream"))
    # what a Spark executor hands to the driver: data, no live exception
    import pickle
    on_driver = pickle.loads(pickle.dumps(shipped))
    assert on_driver.exception is None
    assert policy.disposition(on_driver) is Disposition.RETRY
    assert policy.disposition(RuntimeError("HTTP 400")) is Disposition.DEAD_LETTER
    assert policy.disposition(ErrorInfo("pkg.GatewayTimeout", "slow")) is Disposition.RETRY


def test_naming_default_and_option() -> None:
    assert RetryPolicy().topic_naming is Naming.PER_DELAY
    assert RetryPolicy(naming="per-attempt").topic_naming is Naming.PER_ATTEMPT
    assert RetryPolicy().max_attempts == 3


class HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def test_a_predicate_that_raises_does_not_match_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Written for HTTP errors, it meets others, and errors shipped as data without their live
    exception: it must not stop the runtime there."""
    def throttled(error: ErrorInfo) -> bool:
        return error.exception.status == 429  # type: ignore[union-attr]

    policy = RetryPolicy(not_retryable=~predicate(throttled) & error_type(HttpError))
    assert policy.disposition(ErrorInfo.from_exception(HttpError(500))) is Disposition.DEAD_LETTER
    assert policy.disposition(ErrorInfo.from_exception(HttpError(429))) is Disposition.RETRY
    with caplog.at_level("WARNING", logger="redrive.policy"):
        for _ in range(3):  # no .status: the predicate raises AttributeError
            assert policy.disposition(ErrorInfo.from_exception(KeyError("k"))) \
                is Disposition.RETRY
        name = qualified_name(HttpError)
        shipped = ErrorInfo(name, "HTTP 500", "", ((name, "Exception"),))
        # A shipped error has no live exception (None.status): not matching, so negated, it
        # matches, and HttpError by name does too.
        assert policy.disposition(shipped) is Disposition.DEAD_LETTER
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # AttributeError both times: said once
    assert "raised AttributeError on KeyError" in warnings[0]
    assert "counts as not matching" in warnings[0]


def test_a_policy_and_a_limit_made_again_from_their_fields_keep_their_durations() -> None:
    # Kept as ms in an int field, a duration was read as seconds when made again: a 1 h retry
    # period became 41 days, a 10 m cool-off 7 days.
    policy = RetryPolicy(max_retry_period="1h",
                         dead_letter_limit=DeadLetterLimit(consecutive=5, cool_off="10m"))
    again = dataclasses.replace(policy, attempts=5)
    assert again.max_retry_period_ms == policy.max_retry_period_ms == 3_600_000
    limit = dataclasses.replace(policy.dead_letter_limit, consecutive=10)
    assert limit.cool_off_ms == 600_000
    assert DeadLetterLimit(**dataclasses.asdict(limit)).cool_off_ms == 600_000
    assert RetryPolicy(max_retry_period=3600) == RetryPolicy(max_retry_period="1h")
    assert pickle.loads(pickle.dumps(again)).max_retry_period_ms == 3_600_000
    assert RetryPolicy().max_retry_period_ms is None and DeadLetterLimit(
        consecutive=1).cool_off_ms is None
