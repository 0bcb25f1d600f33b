import gc
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st

from redrive import headers as h
from redrive.errors import MalformedHeader
from redrive.first_failures import FirstFailures
from redrive.policy import Backoff, RetryPolicy
from redrive.policy.classify import error_type, message_matches, predicate
from redrive.record import ErrorInfo, Record
from redrive.routing import DeadLetter, Retry, route

NOW = 1_700_000_000_000



def make_policy(backoff: Backoff, attempts: int | None, **rest: object) -> RetryPolicy:
    if backoff.implied_attempts is not None:
        attempts = None  # a sequence implies its own count
    return RetryPolicy(backoff=backoff, attempts=attempts, **rest)  # type: ignore[arg-type]


policies = st.builds(
    make_policy,
    backoff=st.sampled_from([Backoff.fixed("1s"), Backoff.fixed("1h"),
                             Backoff.exponential("10ms", jitter=0.5),
                             Backoff.sequence("2s,10s")]),
    attempts=st.sampled_from([None, 1, 3]),
    not_retryable=st.sampled_from([None, "ValueError", message_matches("bad.*")]),
    max_retry_period=st.sampled_from([None, "1500ms", "1d"]),
    dead_letter=st.booleans(),
    max_error_message_bytes=st.sampled_from([0, 5, 1024]),
    header_format=st.sampled_from(["redrive", "spring"]),
)
errors = st.builds(ErrorInfo, type_name=st.sampled_from(["ConnectionError", "ValueError", ""]),
                   message=st.sampled_from(["down", "bad input", "é" * 40, ""]),
                   trace=st.sampled_from(["", "Traceback ...\nValueError: bad input"]),
                   chain=st.sampled_from([(), (("ValueError", "Exception"),)]))
foreign_headers = st.lists(st.tuples(st.sampled_from(["traceparent", "kafka_dlt-original-topic",
                                                      "x-redrive-like", "REDRIVE-attempt"]),
                                     st.binary(max_size=4)), max_size=3)


def policy_with_steady_delay(policy: RetryPolicy) -> RetryPolicy:
    """A jittered backoff gives each record its own due time; both paths must draw the same."""
    jitter = getattr(policy.backoff, "jitter", 0.0)
    if jitter:
        policy.backoff.rng.seed(7)  # type: ignore[attr-defined]
    return policy


@settings(max_examples=400, deadline=None)
@given(policy=policies, error=errors, pairs=foreign_headers,
       partition=st.integers(0, 50), offset=st.integers(0, 2**62),
       timestamp=st.sampled_from([None, -1, 0, NOW - 5, NOW * 1000]),
       topic=st.sampled_from(["orders", "a.b"]))
def test_a_first_failure_routes_as_the_general_path_does(
        policy: RetryPolicy, error: ErrorInfo, pairs: list[tuple[str, bytes]], partition: int,
        offset: int, timestamp: int | None, topic: str) -> None:
    record = Record(topic, partition, offset, timestamp, b"k", b"v", pairs)
    policy_with_steady_delay(policy)
    fast = FirstFailures(policy, "billing", NOW).route(topic, partition, offset, timestamp,
                                                       pairs, error)
    policy_with_steady_delay(policy)
    general = route(record, error, policy, NOW, group="billing")
    if fast is None:
        # Declined only where the general path must decide.
        assert not error.type_name or (isinstance(general, DeadLetter)
                                       and policy.header_format.value == "spring")
        return
    assert fast == general
    h.read_delivery(fast.headers)  # a copy redrive can read back


def test_a_timestamp_stamped_in_microseconds_is_left_out_of_the_copy() -> None:
    """Past the year 9999 as ms: a header of it would make the copy unreadable, and its next
    failure dead-letter it as malformed."""
    record = Record("orders", 0, 5, NOW * 1000, b"k", b"v", [])
    copy = route(record, ConnectionError("down"), RetryPolicy(), NOW, group="g")
    assert isinstance(copy, Retry)
    delivery = h.read_delivery(copy.headers)
    assert delivery.original is not None and delivery.original.timestamp_ms is None
    again = route(Record(copy.topic, 0, 0, NOW, b"k", b"v", copy.headers),
                  ConnectionError("down"), RetryPolicy(), NOW, group="g")
    assert isinstance(again, Retry) and again.attempt == 2


def test_each_record_gets_its_own_origin_and_the_error_is_classified_once() -> None:
    seen: list[ErrorInfo] = []

    def classify(info: ErrorInfo) -> bool:
        seen.append(info)
        return False

    policy = RetryPolicy(backoff=Backoff.fixed("5m"), not_retryable=predicate(classify))
    routes = FirstFailures(policy, "billing", NOW)
    error = ErrorInfo("ConnectionError", "down")
    first = routes.route("orders", 0, 10, NOW - 1, [], error)
    second = routes.route("orders", 1, 11, None, [("trace", b"x")], error)
    assert isinstance(first, Retry) and isinstance(second, Retry)
    assert len(seen) == 1
    assert (first.topic, first.due_ms, first.partition) == ("orders.billing.retry.5m",
                                                            NOW + 300_000, 0)
    assert h.read_delivery(first.headers).original.offset == 10  # type: ignore[union-attr]
    assert h.read_delivery(second.headers).original.offset == 11  # type: ignore[union-attr]
    assert h.last(second.headers, h.ORIGINAL_TIMESTAMP) is None
    assert second.headers[0] == ("trace", b"x")


def test_records_with_history_or_unreadable_errors_are_left_to_the_general_path() -> None:
    routes = FirstFailures(RetryPolicy(), "billing", NOW)
    error = ErrorInfo("ConnectionError", "down")
    assert routes.route("orders", 0, 1, NOW, [(h.ATTEMPT, b"1")], error) is None
    assert routes.route("orders", 0, 1, NOW, [(h.ATTEMPT, b"x")], error) is None
    assert routes.route("orders", 0, 1, NOW, [], ErrorInfo("", "no type")) is None
    malformed = ErrorInfo.from_exception(MalformedHeader(h.ATTEMPT, b"x", "not a number"))
    assert routes.route("orders", 0, 1, NOW, [], malformed) is None


@settings(max_examples=200, deadline=None)
@given(policy=policies, error=errors, later_ms=st.integers(0, 10**8))
def test_a_record_routed_at_its_own_time_gets_that_times_due_and_first_failure(
        policy: RetryPolicy, error: ErrorInfo, later_ms: int) -> None:
    # A consumer makes one per poll batch and routes each record at the moment it failed.
    routes = FirstFailures(policy, "billing", NOW)
    routes.route("orders", 0, 1, NOW, [], error)  # the template is made at the batch's start
    at = NOW + later_ms
    policy_with_steady_delay(policy)
    fast = routes.route("orders", 0, 2, NOW, [], error, at)
    policy_with_steady_delay(policy)
    general = route(Record("orders", 0, 2, NOW, b"k", b"v", []), error, policy, at,
                    group="billing")
    assert fast is None or fast == general
    if isinstance(fast, Retry):
        assert h.read_delivery(fast.headers).first_failure_ms == at
        assert fast.due_ms >= at


class Down(ConnectionError):
    """A class of its own: builtin exceptions cannot be weakly referenced."""


def test_a_raised_error_is_not_kept_with_its_traceback() -> None:
    # The traceback holds the frames that caught the error, and with them a consumer's batch.
    routes = FirstFailures(RetryPolicy(), "billing", NOW)
    raised: list[weakref.ref[BaseException]] = []
    routed = []
    gc.disable()  # so that only references, not the cyclic collector, decide what is freed
    try:
        for offset in (1, 2):  # a template made, then used
            try:
                raise Down("down")
            except Down as exc:
                raised.append(weakref.ref(exc))
                error = ErrorInfo.from_exception(exc)
            routed.append(routes.route("orders", 0, offset, NOW, [], error))
            del error
        assert [r() for r in raised] == [None, None]
    finally:
        gc.enable()
    assert all(isinstance(route, Retry) for route in routed)


class Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__("refused")  # errors equal as data: same type, message and trace
        self.status = status


def raised(status: int) -> ErrorInfo:
    try:
        raise Refused(status)
    except Refused as exc:
        return ErrorInfo.from_exception(exc)


def test_errors_equal_as_data_are_each_classified_where_a_predicate_reads_the_exception() -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("5m"), not_retryable=predicate(
        lambda error: getattr(error.exception, "status", 0) == 400))
    assert not policy.routes_by_data
    routes = FirstFailures(policy, "billing", NOW)
    errors = [raised(status) for status in (503, 400, 503, 400)]
    assert errors[0] == errors[1]
    for offset, error in enumerate(errors):
        fast = routes.route("orders", 0, offset, NOW, [], error)
        general = route(Record("orders", 0, offset, NOW, b"k", b"v", []), error, policy, NOW,
                        group="billing")
        assert fast == general
        assert isinstance(fast, DeadLetter if offset % 2 else Retry)


def test_matchers_of_names_and_messages_read_data_only() -> None:
    data = error_type("ValueError") | (message_matches("bad") & ~error_type("KeyError"))
    assert data.reads_data_only
    assert RetryPolicy(not_retryable=data).routes_by_data
    assert not (data | predicate(lambda error: True)).reads_data_only
    assert not RetryPolicy(retry_on=~predicate(lambda error: True)).routes_by_data
