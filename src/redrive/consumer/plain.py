"""The consumer's common case in a loop of its own: a run of one partition's records that carry no
headers, each handed to the handler as a Record.

Such a record has no redrive history, no due time and no group filter, so it needs nothing but a
Record and a handler call. `handle_plain` takes a run of them until one needs more (headers, an
error, another partition) or its handler raises. redrive.consumer._plainrun (beside this module)
does the same in C when it is built: there, building the Record and calling the handler skip the
interpreter's per-record work, which is most of what the runtime adds to a raw confluent-kafka
loop. This module's version is the reference and the fallback; the tests hold both to the same
results.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Message

from redrive.kafka.records import headers_or_malformed
from redrive.record import NO_HISTORY, Record, RecordDraft

Handler = Callable[[Record], object]
# (index after the last record taken, records whose handler returned, offset of the last of them
# or -1, the sampling countdown left, the record whose handler raised or None, its exception)
PlainRun = tuple[int, int, int, int, Record | None, Exception | None]


def not_awaited(returned: object) -> None:
    """Fail the record whose handler returned an awaitable (a handler calling an async function
    without awaiting it): nothing runs a coroutine that redrive does not await, so the record
    was not handled. The C loop raises the same TypeError."""
    if inspect.isawaitable(returned):
        if inspect.iscoroutine(returned):
            returned.close()  # not awaited: no warning, no running
        raise TypeError(f"the handler returned {type(returned).__name__}, an awaitable, which "
                        "redrive does not await: its record was not handled")


def handle_plain_python(messages: Sequence[Message], start: int, topic: str, partition: int,
                        handler: Handler, until_sample: int, sample_every: int,
                        times: list[float], stop: bytearray) -> PlainRun:
    """Hand messages[start:] to `handler` while each is a headerless record of `topic`/`partition`
    and the handler returns; stop after a handler raises an Exception, before a record of another
    kind, or when stop[0] is set (checked before each record).

    The handler call that brings `until_sample` to zero is timed into `times` and the countdown
    starts again at `sample_every`. A BaseException that is not an Exception propagates.
    """
    index, count = start, len(messages)
    handled, last = 0, -1
    while index < count and not stop[0]:
        message = messages[index]
        if message.error() is not None or headers_or_malformed(message) is not None \
                or message.partition() != partition or message.topic() != topic:
            break
        offset: int = message.offset()  # type: ignore[assignment]
        # Built as new_record builds it, without the call (see RecordDraft).
        record: Any = RecordDraft()
        record.topic = topic
        record.partition = partition
        record.offset = offset
        record.timestamp_ms = message.timestamp()[1]
        record.key = message.key()
        record.value = message.value()
        record.headers = []
        record.delivery = NO_HISTORY
        record.__class__ = Record
        index += 1
        until_sample -= 1
        try:
            if until_sample:
                returned = handler(record)
            else:
                until_sample = sample_every
                started = time.perf_counter()
                try:
                    returned = handler(record)
                finally:
                    times.append(time.perf_counter() - started)
            if returned is not None:
                not_awaited(returned)
        except Exception as exc:
            return index, handled, last, until_sample, record, exc
        handled += 1
        last = offset
    return index, handled, last, until_sample, None, None


handle_plain: Callable[[Sequence[Message], int, str, int, Handler, int, int, list[float],
                        bytearray], PlainRun]
try:
    from redrive.consumer._plainrun import handle_plain
except ImportError:  # not built (the extension is optional): the Python loop serves
    handle_plain = handle_plain_python
