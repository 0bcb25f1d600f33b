"""redrive._headers, the header contract's common case in C: wherever it answers, it answers what
the Python reference (headers.read_delivery_python, headers.replace_python) answers; it answers
for the headers redrive itself writes; and it leaves every malformed value to the reference,
which raises the MalformedHeader naming it."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from redrive import _headers
from redrive import headers as h
from redrive.errors import MalformedHeader
from redrive.policy import Backoff, RetryPolicy
from redrive.record import NO_HISTORY, Delivery, ErrorInfo, Origin, new_record
from redrive.routing import Retry, route

READ = (h.ATTEMPT, h.DUE, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET, h.ORIGINAL_TIMESTAMP,
        h.FIRST_FAILURE, h.ORIGINAL_TOPIC, h.GROUP, h.TARGET)

# Values as they come off the wire: redrive's own forms and everything a broken writer may put.
raw_values = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b" 7", b"7 ", b"-1", b"+1", b"1e3", b"0x10", b"\xff", b"\xc3\x28",
                     b"0" * 19, b"9" * 19, b"9" * 20, b"\xd9\xa3", "١٢".encode()]),
    st.text(max_size=12).map(str.encode),
    st.binary(max_size=12),
)
names = st.one_of(st.sampled_from((*READ, h.REASON, h.ERROR_TYPE, "redrive-", "redrive-x")),
                  st.text(max_size=16))
header_lists = st.lists(st.tuples(names, raw_values), max_size=14)


def python_read(headers: list[tuple[str, bytes]]) -> Delivery | MalformedHeader:
    try:
        return h.read_delivery_python(headers)
    except MalformedHeader as exc:
        return exc


@settings(max_examples=3000)
@given(header_lists)
@example([(h.ORIGINAL_TOPIC, b"orders")])  # a partial origin
@example([(h.GROUP, b"")])
@example([(h.ATTEMPT, b"99999999999999999999")])
def test_c_reads_what_python_reads_or_leaves_it_to_python(
        headers: list[tuple[str, bytes]]) -> None:
    answer = _headers.read_delivery(headers)
    expected = python_read(headers)
    if answer is None:
        return  # deferred: read_delivery takes the Python way
    assert not isinstance(expected, MalformedHeader), (headers, answer)
    assert answer == expected
    assert type(answer) is Delivery
    if answer.original is not None:
        assert type(answer.original) is Origin


def test_c_reads_the_headers_routing_writes() -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=5)
    record = new_record("orders", 3, 42, 1_700_000_000_000, b"k", b"v", [("trace-id", b"a1")],
                        NO_HISTORY)
    decision = route(record, ErrorInfo("ValueError", "bad ünïcode"), policy, 1_700_000_000_500,
                     group="billing")
    assert isinstance(decision, Retry)
    delivery = _headers.read_delivery(decision.headers)
    assert delivery == Delivery(attempt=1, first_failure_ms=1_700_000_000_500, group="billing",
                                original=Origin("orders", 3, 42, 1_700_000_000_000),
                                due_ms=1_700_000_000_600)
    assert _headers.read_delivery([("trace-id", b"a1")]) is NO_HISTORY
    assert _headers.read_delivery([]) is NO_HISTORY


@pytest.mark.parametrize(("name", "raw"), [
    (h.ATTEMPT, b"two"), (h.DUE, b"-5"), (h.FIRST_FAILURE, b"1" * 20),
    (h.GROUP, b"\xff"), (h.TARGET, b""),
    # Past what Kafka and Spark hold: a 32-bit attempt or partition, a 64-bit offset, a time
    # past the year 9999.
    (h.ATTEMPT, b"2147483648"), (h.ORIGINAL_PARTITION, b"2147483648"),
    (h.ORIGINAL_OFFSET, b"9223372036854775808"), (h.DUE, b"253402300800000"),
    (h.ORIGINAL_TIMESTAMP, b"9" * 19),
])
def test_a_malformed_value_is_left_to_python_which_names_it(name: str, raw: bytes) -> None:
    headers = [(name, raw)]
    assert _headers.read_delivery(headers) is None
    with pytest.raises(MalformedHeader) as caught:
        h.read_delivery(headers)
    assert caught.value.header == name


def test_the_largest_values_are_read_alike() -> None:
    headers = [(h.ATTEMPT, b"2147483647"), (h.DUE, b"253402300799999"),
               (h.ORIGINAL_TOPIC, b"t"), (h.ORIGINAL_PARTITION, b"2147483647"),
               (h.ORIGINAL_OFFSET, b"9223372036854775807"), (h.FIRST_FAILURE, b"0")]
    delivery = _headers.read_delivery(headers)
    assert delivery == h.read_delivery_python(headers)
    assert delivery is not None and delivery.original is not None
    assert (delivery.attempt, delivery.due_ms, delivery.original.offset) == (
        2**31 - 1, 253_402_300_799_999, 2**63 - 1)


@pytest.mark.parametrize("headers", [
    ((h.ATTEMPT, b"1"),),  # a tuple, not a list
    [[h.ATTEMPT, b"1"]],  # a pair that is a list
    [(h.ATTEMPT, bytearray(b"1"))],
])
def test_other_shapes_are_left_to_python(headers: Any) -> None:
    assert _headers.read_delivery(headers) is None
    assert h.read_delivery(headers).attempt == 1


def test_a_pair_that_is_not_a_pair_is_left_to_python() -> None:
    assert _headers.read_delivery([(h.ATTEMPT, b"1", b"extra")]) is None
    assert _headers.replace([(h.ATTEMPT, b"1", b"extra")], {}) is None


update_values = st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=8),
                          st.integers(min_value=-(2**70), max_value=2**70), st.booleans())


@settings(max_examples=2000)
@given(header_lists, st.dictionaries(names, update_values, max_size=8))
def test_c_replaces_as_python_does(headers: list[tuple[str, bytes]],
                                   updates: dict[str, Any]) -> None:
    expected = h.replace_python(headers, updates)
    answer = _headers.replace(headers, updates)
    assert answer == expected
    assert all(type(name) is str and type(value) is bytes for name, value in answer)


def test_replace_leaves_other_shapes_to_python() -> None:
    assert _headers.replace(((h.ATTEMPT, b"1"),), {h.ATTEMPT: 2}) is None
    assert _headers.replace([(h.ATTEMPT, b"1")], [(h.ATTEMPT, 2)]) is None
    assert _headers.replace([[h.ATTEMPT, b"1"]], {h.ATTEMPT: 2}) is None
    assert h.replace(((h.ATTEMPT, b"1"), ("x", b"y")), {h.ATTEMPT: 2}) == [
        ("x", b"y"), (h.ATTEMPT, b"2")]


class Name(str):
    """A header name whose comparisons run Python code."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Name.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class Shown:
    """An update value whose str() runs Python code that changes the updates."""

    def __init__(self, updates: dict[Any, Any]) -> None:
        self.updates = updates

    def __str__(self) -> str:
        self.updates.clear()
        return "shown"


def test_replace_leaves_updates_that_run_python_code_to_python() -> None:
    # A key's __eq__ or a value's __str__ could change the list or the dict under C's loops.
    headers = [(h.ATTEMPT, b"1"), ("x", b"y")]
    named = {Name(h.ATTEMPT): 2}
    assert _headers.replace(headers, named) is None
    assert Name.compared == 0
    assert h.replace(headers, named) == h.replace_python(headers, named)
    updates: dict[str, Any] = {h.REASON: "r"}
    updates["redrive-" + "dynamic" * 20] = Shown(updates)
    assert _headers.replace(headers, dict(updates)) is None
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        h.replace(headers, updates)
    assert headers == [(h.ATTEMPT, b"1"), ("x", b"y")]


def test_calls_keep_no_memory() -> None:
    good = [(h.ATTEMPT, b"3"), (h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"1"),
            (h.ORIGINAL_OFFSET, b"9"), (h.GROUP, b"g"), (h.TARGET, b"t")]
    deferred = [*good, (h.DUE, b"x")]

    def calls() -> None:
        for _ in range(10_000):
            _headers.read_delivery(good)
            _headers.read_delivery(deferred)
            _headers.replace(good, {h.ATTEMPT: 4, h.DUE: None, h.GROUP: "other"})

    calls()  # warm caches and free lists
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        calls()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 20_000  # one object kept per call would be over 300 KB
