"""A copy too large for the producer that writes it: its error text cut, or a clear error.

A retry or dead-letter copy is the failed record plus redrive's headers, whose error trace alone
may hold kilobytes. A record that was near its producer's `message.max.bytes` fits no more once
they are added, and librdkafka refuses it at `produce()`. Rather than stop the runtime over text
that only describes the error, the copy goes out with that text cut (the trace replaced by a
note saying why, the message shortened); the record's own key, value and headers, its origin,
attempt and error type stay whole. A copy still too large without the text is refused with
`RecordTooLarge`, which names the record and the setting to raise: nothing is committed past it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from redrive import headers as h
from redrive.dead_letter_headers import SPRING_EXCEPTION
from redrive.errors import RecordTooLarge
from redrive.kafka.records import OutRecord, record_size

CUT_NOTE = b"(left out: the copy was larger than the producer's message.max.bytes)"
MESSAGE_KEPT = 200  # bytes of an error message kept in a cut copy, at most
_ELLIPSIS = "…".encode()

_TRACES = frozenset({h.ERROR_TRACE, SPRING_EXCEPTION + "stacktrace"})
_MESSAGES = frozenset({h.ERROR_MESSAGE, SPRING_EXCEPTION + "message"})


def slimmed(record: OutRecord) -> OutRecord:
    """`record` with its error trace and message cut, or RecordTooLarge if nothing is left to
    cut (the producer refused it as it is)."""
    cut: list[tuple[str, bytes | None]] = []
    changed = False
    for name, value in record.headers:
        # A null trace stays null; a short one would not shrink.
        if name in _TRACES and value is not None and len(value) > len(CUT_NOTE):
            value, changed = CUT_NOTE, True
        elif name in _MESSAGES and value is not None and len(value) > MESSAGE_KEPT:
            value, changed = _shortened(value), True
        cut.append((name, value))
    if not changed:
        raise RecordTooLarge(record.topic, record_size(record), _origin(record.headers),
                             cut=any(name in _TRACES for name, _ in record.headers))
    return dataclasses.replace(record, headers=cut)


def _shortened(message: bytes) -> bytes:
    kept = message[:MESSAGE_KEPT - len(_ELLIPSIS)]
    # Cut on a character boundary: the header is UTF-8 text.
    return kept.decode("utf-8", "ignore").encode() + _ELLIPSIS


def _origin(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """Where the copied record was first read, as topic[partition]@offset, if its headers say."""
    found = {name: value for name, value in headers
             if name in (h.ORIGINAL_TOPIC, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET)
             and value is not None}
    if len(found) < 3:
        return None
    try:
        return (f"{found[h.ORIGINAL_TOPIC].decode()}[{int(found[h.ORIGINAL_PARTITION])}]"
                f"@{int(found[h.ORIGINAL_OFFSET])}")
    except ValueError:
        return None
