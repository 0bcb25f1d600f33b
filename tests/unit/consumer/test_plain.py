"""handle_plain, the consumer's loop over headerless records: the C version
(redrive.consumer._plainrun) and the Python reference give the same results, records and errors on
the same messages."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import signal
import sys
import traceback
import types
import warnings
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from redrive.consumer import _plainrun
from redrive.consumer.plain import PlainRun, handle_plain, handle_plain_python
from redrive.errors import MalformedHeader
from redrive.kafka.records import raw_headers
from redrive.record import NO_HISTORY, Record

from ..fakes import FakeMessage

IMPLEMENTATIONS = {"c": _plainrun.handle_plain, "python": handle_plain_python}
HandlePlain = Callable[..., PlainRun]


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def run(request: pytest.FixtureRequest) -> HandlePlain:
    return IMPLEMENTATIONS[request.param]


def message(offset: int, partition: int = 0, topic: str = "orders", **extra: Any) -> Message:
    fields: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset,
                              "key": f"k{offset}".encode(), "value": f"v{offset}".encode(),
                              "timestamp": (1, 1_700_000_000_000 + offset), **extra}
    return Message(**fields)


def collect(seen: list[Record], fail_offsets: set[int] = frozenset(),  # type: ignore[assignment]
            ) -> Callable[[Record], None]:
    def handler(record: Record) -> None:
        seen.append(record)
        if record.offset in fail_offsets:
            raise ValueError(f"bad {record.offset}")
    return handler


def test_the_built_loop_is_the_one_the_runtime_uses() -> None:
    assert handle_plain is _plainrun.handle_plain


def test_a_run_of_one_partition_becomes_records_until_a_record_of_another_kind(
        run: HandlePlain) -> None:
    messages = [message(0), message(1), message(2), message(3, headers=[("h", b"1")]),
                message(4)]
    seen: list[Record] = []
    result = run(messages, 0, "orders", 0, collect(seen), 100, 100, [], bytearray(1))
    assert result == (3, 3, 2, 97, None, None)
    assert seen == [Record("orders", 0, offset, 1_700_000_000_000 + offset,
                           f"k{offset}".encode(), f"v{offset}".encode(), [], NO_HISTORY)
                    for offset in range(3)]
    assert all(type(record) is Record for record in seen)
    assert len({id(record.headers) for record in seen}) == 3  # a list of its own each
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].offset = 9  # type: ignore[misc]


@pytest.mark.parametrize("other", [
    message(2, partition=1),
    message(2, topic="payments"),
    message(2, error=KafkaError(KafkaError._PARTITION_EOF)),
    message(2, headers=[]),
])
def test_the_run_ends_before_another_partition_topic_an_error_or_headers(
        run: HandlePlain, other: Message) -> None:
    seen: list[Record] = []
    messages = [message(0), message(1), other, message(3)]
    assert run(messages, 0, "orders", 0, collect(seen), 100, 100, [], bytearray(1)) == \
        (2, 2, 1, 98, None, None)
    assert [record.offset for record in seen] == [0, 1]


def test_a_run_may_start_mid_batch_and_end_at_its_end(run: HandlePlain) -> None:
    seen: list[Record] = []
    messages = (message(0, partition=1), message(5), message(6))  # any sequence
    assert run(messages, 1, "orders", 0, collect(seen), 100, 100, [], bytearray(1)) == \
        (3, 2, 6, 98, None, None)
    assert run(messages, 3, "orders", 0, collect(seen), 7, 100, [], bytearray(1)) == \
        (3, 0, -1, 7, None, None)
    assert [record.offset for record in seen] == [5, 6]


def test_a_raising_handler_ends_the_run_with_its_record_and_exception(run: HandlePlain) -> None:
    seen: list[Record] = []
    messages = [message(offset) for offset in range(6)]
    index, handled, last, until, failed, failure = run(
        messages, 0, "orders", 0, collect(seen, {3}), 100, 100, [], bytearray(1))
    assert (index, handled, last, until) == (4, 3, 2, 96)
    assert failed is seen[-1] and failed is not None and failed.offset == 3
    assert isinstance(failure, ValueError) and str(failure) == "bad 3"
    frames = [frame.name for frame in traceback.extract_tb(failure.__traceback__)]
    assert frames[-1] == "handler"  # the trace reaches where the handler raised
    # The run goes on after the failed record when called again, as the runtime does.
    assert run(messages, index, "orders", 0, collect(seen), until, 100, [], bytearray(1)) == \
        (6, 2, 5, 94, None, None)


class Later:
    """An awaitable that is not a coroutine."""

    def __await__(self) -> Any:
        yield None


@pytest.mark.parametrize("sample_every", [1, 100])  # the timed call and the untimed one
def test_a_handler_returning_an_awaitable_fails_its_record(run: HandlePlain,
                                                          sample_every: int) -> None:
    """A handler that calls an async function without awaiting it handled nothing: its record
    fails (to be routed), the coroutine is closed unrun; other results are ignored."""
    ran: list[int] = []

    async def handle_async(record: Record) -> None:
        ran.append(record.offset)

    def handler(record: Record) -> object:
        if record.offset == 1:
            return handle_async(record)
        if record.offset == 3:
            return Later()
        return "ignored"

    messages = [message(offset) for offset in range(5)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = run(messages, 0, "orders", 0, handler, sample_every, sample_every, [],
                    bytearray(1))
        gc.collect()
    assert caught == []  # closed: no "coroutine ... was never awaited"
    index, handled, last, _, failed, failure = first
    assert (index, handled, last) == (2, 1, 0)
    assert failed is not None and failed.offset == 1
    assert isinstance(failure, TypeError)
    assert str(failure) == ("the handler returned coroutine, an awaitable, which redrive does "
                            "not await: its record was not handled")
    index, handled, last, _, failed, failure = run(messages, index, "orders", 0, handler, 100,
                                                   100, [], bytearray(1))
    assert (index, handled, last) == (4, 1, 2) and failed is not None and failed.offset == 3
    assert "the handler returned Later, an awaitable" in str(failure)
    assert ran == []


@types.coroutine
def generator_based() -> Generator[None, None, None]:
    yield


class Registered:
    """Awaitable by registration alone: its type has no __await__."""


Awaitable.register(Registered)


async def stubborn() -> None:
    try:
        await Later()
    except GeneratorExit:
        await Later()  # so close() raises RuntimeError


def started_stubborn() -> object:
    coroutine = stubborn()
    coroutine.send(None)
    return coroutine


@pytest.mark.parametrize(("returned", "failure_type"), [
    (generator_based, TypeError),
    (Registered, TypeError),
    (started_stubborn, RuntimeError),  # what close() raised, as in plain.not_awaited
])
def test_what_inspect_calls_awaitable_fails_its_record(
        run: HandlePlain, returned: Callable[[], object], failure_type: type) -> None:
    messages = [message(offset) for offset in range(3)]
    index, handled, last, _, failed, failure = run(
        messages, 0, "orders", 0, lambda record: returned(), 100, 100, [], bytearray(1))
    assert (index, handled, last) == (1, 0, -1)
    assert failed is not None and failed.offset == 0
    assert type(failure) is failure_type


def test_an_exception_that_is_not_an_error_propagates(run: HandlePlain) -> None:
    def handler(record: Record) -> None:
        if record.offset == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run([message(0), message(1), message(2)], 0, "orders", 0, handler, 100, 100, [],
            bytearray(1))


def test_every_nth_handler_call_is_timed(run: HandlePlain) -> None:
    times: list[float] = []

    def handler(record: Record) -> None:
        for _ in range(1000):
            pass

    messages = [message(offset) for offset in range(10)]
    assert run(messages, 0, "orders", 0, handler, 3, 4, times, bytearray(1))[3] == 1
    assert len(times) == 2  # the 3rd and 7th calls
    assert all(0 < took < 1 for took in times)


def test_a_stop_asked_by_the_handler_ends_the_run_after_its_record(run: HandlePlain) -> None:
    stop = bytearray(1)
    seen: list[Record] = []

    def handler(record: Record) -> None:
        seen.append(record)
        if record.offset == 2:
            stop[0] = 1

    messages = [message(offset) for offset in range(6)]
    assert run(messages, 0, "orders", 0, handler, 100, 100, [], stop) == \
        (3, 3, 2, 97, None, None)
    assert run(messages, 3, "orders", 0, handler, 100, 100, [], stop)[:3] == (3, 0, -1)
    assert len(seen) == 3


class Signalling(Message):  # type: ignore[misc]
    """A message whose key() raises SIGUSR1 through libc, as a signal arrives while a C handler
    runs: no bytecode runs and nothing checks for it until the loop does. (os.kill and
    signal.raise_signal run the Python handler at once themselves.)"""

    key = functools.partial(ctypes.CDLL(None)["raise"], signal.SIGUSR1)


@pytest.mark.parametrize("raises", [False, True])
def test_a_signal_during_the_run_is_handled_before_the_next_record(run: HandlePlain,
                                                                   raises: bool) -> None:
    stop = bytearray(1)

    def on_signal(signum: int, frame: object) -> None:
        if raises:
            raise RuntimeError("told to stop")
        stop[0] = 1  # as signals.stop_on_signals does

    messages = [Signalling(topic="orders", partition=0, offset=0, value=b"v0",
                           timestamp=(1, 1_700_000_000_000)),
                *(message(offset) for offset in range(1, 100))]
    seen: list[Record] = []
    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:
        if raises:
            with pytest.raises(RuntimeError, match="told to stop"):
                run(messages, 0, "orders", 0, seen.append, 1_000, 1_000, [], stop)
            assert len(seen) <= 1
        else:
            assert run(messages, 0, "orders", 0, seen.append, 1_000, 1_000, [], stop) == \
                (1, 1, 0, 999, None, None)
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_handler_that_shortens_the_messages_or_the_stop_flag_gets_the_reference_s_error(
        run: HandlePlain) -> None:
    messages = [message(offset) for offset in range(6)]
    everything = list(messages)  # the messages dropped from the list stay alive
    stop = bytearray(1)

    def shorten_messages(record: Record) -> None:
        if record.offset == 1:
            del messages[3:]

    with pytest.raises(IndexError):
        run(messages, 0, "orders", 0, shorten_messages, 100, 100, [], stop)
    assert len(everything) == 6

    def empty_stop(record: Record) -> None:
        stop.clear()

    with pytest.raises(IndexError):
        run(everything, 0, "orders", 0, empty_stop, 100, 100, [], stop)


def test_a_stop_flag_moved_by_the_handler_is_read_where_it_now_is(run: HandlePlain) -> None:
    stop = bytearray(1)
    seen: list[Record] = []

    def handler(record: Record) -> None:
        seen.append(record)
        stop[:] = b"\1" + bytes(100_000)  # a new buffer

    assert run([message(offset) for offset in range(3)], 0, "orders", 0, handler, 100, 100, [],
               stop)[:3] == (1, 1, 0)
    assert len(seen) == 1


def test_messages_of_other_types_are_read_through_their_methods(run: HandlePlain) -> None:
    seen: list[Record] = []
    messages = [FakeMessage("orders", 0, 7, b"v"), FakeMessage("orders", 0, 8, b"w", [])]
    assert run(messages, 0, "orders", 0, collect(seen), 100, 100, [], bytearray(1))[:3] == \
        (1, 1, 7)
    assert seen == [Record("orders", 0, 7, 1_700_000_000_000, None, b"v")]


def test_no_reference_is_kept_or_lost(run: HandlePlain) -> None:
    value, key = b"value-" * 20, b"key-" * 20
    messages = [message(offset, key=key, value=value) for offset in range(50)]
    gc.collect()  # records other tests left in cycles would go in the middle of the count
    counts = sys.getrefcount(value), sys.getrefcount(key), sys.getrefcount(NO_HISTORY)
    for _ in range(20):
        run(messages, 0, "orders", 0, collect([], {49}), 100, 100, [], bytearray(1))
        run(messages, 0, "orders", 0, lambda record: None, 100, 100, [], bytearray(1))
    gc.collect()
    assert (sys.getrefcount(value), sys.getrefcount(key), sys.getrefcount(NO_HISTORY)) == counts


def test_records_the_handler_keeps_are_never_refilled(run: HandlePlain) -> None:
    kept: list[Record] = []
    headers_kept: list[list[tuple[str, bytes]]] = []

    def handler(record: Record) -> None:
        if record.offset % 3 == 0:
            kept.append(record)
        elif record.offset % 3 == 1:
            headers_kept.append(record.headers)  # the list, not the record
        else:
            record.headers.append(("added", b"by the handler"))  # then the record is dropped

    messages = [message(offset) for offset in range(12)]
    assert run(messages, 0, "orders", 0, handler, 100, 100, [], bytearray(1))[:3] == (12, 12, 11)
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in kept] == [
        (offset, f"k{offset}".encode(), f"v{offset}".encode(), 1_700_000_000_000 + offset, [])
        for offset in (0, 3, 6, 9)]
    assert headers_kept == [[]] * 4
    assert len({id(headers) for headers in headers_kept}) == 4  # none handed out again


def test_a_handler_that_keeps_nothing_sees_each_message_whole(run: HandlePlain) -> None:
    # The C loop refills the Record nobody kept: every field must be the new message's. (The
    # refill itself cannot be seen from here: a freed Record's memory is handed straight to the
    # next one, so the same id() proves nothing.)
    seen: list[tuple[Any, ...]] = []

    def handler(record: Record) -> None:
        seen.append((record.topic, record.partition, record.offset, record.timestamp_ms,
                     record.key, record.value, list(record.headers), record.delivery))

    messages = [message(offset, partition=2, key=None if offset == 3 else b"k%d" % offset)
                for offset in range(5)]
    assert run(messages, 0, "orders", 2, handler, 100, 100, [], bytearray(1))[:3] == (5, 5, 4)
    assert seen == [("orders", 2, offset, 1_700_000_000_000 + offset,
                     None if offset == 3 else b"k%d" % offset, f"v{offset}".encode(), [],
                     NO_HISTORY) for offset in range(5)]


class UnreadableHeaderName:
    """A message whose header name is not UTF-8, as confluent-kafka's Message behaves: the first
    headers() fails with SystemError over the decode error, later ones return what set_headers
    put (confluent-kafka would hand back its half-built list)."""

    def __init__(self, offset: int) -> None:
        self._offset, self._headers = offset, None

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def headers(self) -> Any:
        if self._headers is None:
            cause = UnicodeDecodeError("utf-8", b"bad\xffname", 3, 4, "invalid start byte")
            raise SystemError("headers returned a result with an exception set") from cause
        return self._headers

    def set_headers(self, headers: Any) -> None:
        self._headers = headers


def test_a_header_name_that_is_not_utf8_ends_the_run_and_marks_the_message(
        run: HandlePlain) -> None:
    seen: list[Record] = []
    bad = UnreadableHeaderName(1)
    assert run([message(0), bad, message(2)], 0, "orders", 0, collect(seen), 100, 100, [],
               bytearray(1)) == (1, 1, 0, 99, None, None)
    # marked by the loop, so that the runtime reads it again and dead-letters it as malformed,
    # naming the header's bytes
    assert bad.headers() == [("redrive-unreadable-header-name", b"bad\xffname")]
    with pytest.raises(MalformedHeader, match=r"bad\\xffname.*not UTF-8") as raised:
        raw_headers(bad)  # type: ignore[arg-type]
    assert raised.value.value == b"bad\xffname"
