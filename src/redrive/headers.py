"""The header contract: redrive's names, how values are written and read, and validation.

Every value is UTF-8 text (integers in decimal, times in epoch milliseconds) so that kcat and
other plain tools show it as it is. The dead-letter headers of other systems are read in
`redrive.dead_letter_headers`.

`read_delivery` and `replace` run for every failed record and every copy read back. Where it is
built, redrive._headers (beside this module) does their common case in C and answers None for the
rest, which the Python below reads and judges: it is the reference, and the fallback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redrive.errors import InvalidArgument, MalformedHeader
from redrive.record import NO_HISTORY, Delivery, ErrorInfo, Origin

try:
    from redrive import _headers
except ImportError:  # not built (the extension is optional): the Python below serves
    _headers = None  # type: ignore[assignment]

Headers = list[tuple[str, bytes | None]]

PREFIX = "redrive-"
ATTEMPT = "redrive-attempt"
DUE = "redrive-due"
GROUP = "redrive-group"
TARGET = "redrive-target"
ORIGINAL_TOPIC = "redrive-original-topic"
ORIGINAL_PARTITION = "redrive-original-partition"
ORIGINAL_OFFSET = "redrive-original-offset"
ORIGINAL_TIMESTAMP = "redrive-original-timestamp"
FIRST_FAILURE = "redrive-first-failure"
ERROR_TYPE = "redrive-error-type"
ERROR_MESSAGE = "redrive-error-message"
ERROR_TRACE = "redrive-error-trace"
REASON = "redrive-reason"

REASONS = ("exhausted", "not-retryable", "deadline", "malformed")

_INTEGER_HEADERS = (ATTEMPT, DUE, ORIGINAL_PARTITION, ORIGINAL_OFFSET, ORIGINAL_TIMESTAMP,
                    FIRST_FAILURE)


def normalize(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> Headers:
    """Headers as confluent-kafka and Spark hand them over (None for none; None, str or
    bytearray values), as a list of (str, bytes or None). A null value stays None: a copy
    keeps it null, as Kafka tells null from empty."""
    if not headers:
        return []
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    elif type(headers) is list:
        for _, value in headers:
            if type(value) is not bytes and value is not None:
                break
        else:
            # Already (str, bytes or None) pairs, as a consumed message's headers are: handed
            # on as they are, without a copy, on the path of every record that has headers.
            return headers
    out: Headers = []
    for name, value in headers:
        if value is None:
            out.append((name, None))
        elif isinstance(value, str):
            out.append((name, value.encode()))
        elif isinstance(value, bytes | bytearray | memoryview):
            out.append((name, bytes(value)))
        else:
            # bytes(5) would be five zero bytes.
            raise InvalidArgument(f"header {name!r}", value, "must be bytes, str or None")
    return out


def last(headers: Sequence[tuple[str, bytes | None]], name: str, *,
         null: bytes | None = b"") -> bytes | None:
    """The last value of a header (Kafka allows repeats and the latest writer wins); None when
    it is absent. A null value reads as `null`: empty by default, as redrive writes no nulls and
    one of its own headers holding null is as malformed as one holding nothing."""
    for key, value in reversed(headers):
        if key == name:
            return null if value is None else value
    return None


def has_redrive(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    return any(name.startswith(PREFIX) for name, _ in headers)


MALFORMED_PREFIX = "redrive-malformed-"


def set_aside(headers: Sequence[tuple[str, bytes | None]]) -> Headers:
    """The headers with redrive's renamed `redrive-malformed-<name>`: a record dead-lettered as
    malformed keeps its unreadable values, and the redrive headers written on it then parse."""
    return [(MALFORMED_PREFIX + name[len(PREFIX):] if name.startswith(PREFIX) else name, value)
            for name, value in headers]


def readable_group(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The group a record names when another of its redrive headers cannot be read: the copy is
    still that group's alone to dead-letter, not every group's that reads its topic."""
    raw = last(headers, GROUP)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def text_of(headers: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    """A header's last value as text; raises MalformedHeader if it is not UTF-8."""
    return _utf8(name, last(headers, name))


def _utf8(name: str, raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedHeader(name, raw, "not UTF-8 text") from exc


_MAX_DIGITS = 19  # Kafka's offsets and timestamps are 64-bit
# The largest value each number may take, as Kafka and Spark hold it: an attempt and a partition
# are 32-bit (Spark's int columns), an offset 64-bit, a time (epoch ms) at most the end of the
# year 9999, the last a Python datetime holds (Spark's timestamps count µs in 64 bits). Larger,
# a record would fail every Spark task that reads it, and with it the query at each restart.
MAX_INT32 = 2**31 - 1
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_LIMITS = {ATTEMPT: MAX_INT32, DUE: MAX_TIME_MS, ORIGINAL_PARTITION: MAX_INT32,
           ORIGINAL_OFFSET: 2**63 - 1, ORIGINAL_TIMESTAMP: MAX_TIME_MS, FIRST_FAILURE: MAX_TIME_MS}


def _whole_number(name: str, raw: bytes | None) -> int | None:
    if raw is None:
        return None
    if raw.isdigit() and len(raw) <= _MAX_DIGITS:  # ASCII digits: the form redrive writes
        value = int(raw)
    else:
        stripped = (_utf8(name, raw) or "").strip()
        digits = stripped[1:] if stripped[:1] == "-" else stripped
        if not digits.isascii() or not digits.isdigit():
            raise MalformedHeader(name, raw, "expected a decimal integer")
        if len(digits) > _MAX_DIGITS:
            # Python's int() would also refuse thousands of digits.
            raise MalformedHeader(name, raw, f"more than {_MAX_DIGITS} digits")
        value = int(stripped)
        if value < 0:
            raise MalformedHeader(name, raw, "must be >= 0")
    if value > _LIMITS[name]:
        raise MalformedHeader(name, raw, f"must be at most {_LIMITS[name]}")
    return value


def read_due(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    """The record's due time in epoch ms, None when it has none; raises MalformedHeader."""
    try:
        return _whole_number(DUE, last(headers, DUE))
    except MalformedHeader as exc:
        raise _naming_null(exc, headers) from None


def _naming_null(exc: MalformedHeader, headers: Sequence[tuple[str, bytes | None]]
                 ) -> MalformedHeader:
    """`exc` as it reads when the value it names was a null, which redrive reads as empty: an
    operator told of `redrive-due=b''` would look for an empty value the record does not hold."""
    if exc.value == b"" and last(headers, exc.header, null=None) is None:
        return MalformedHeader(exc.header, None, f"a null value ({exc.why})")
    return exc


def read_delivery(headers: Sequence[tuple[str, bytes | None]]) -> Delivery:
    """Decode and validate redrive's headers into a Delivery; raises MalformedHeader."""
    if _headers is not None:
        delivery = _headers.read_delivery(headers)
        if delivery is not None:
            return delivery
    return read_delivery_python(headers)


def read_delivery_python(headers: Sequence[tuple[str, bytes | None]]) -> Delivery:
    """read_delivery without the C extension: the reference, and its way for what C defers."""
    # One pass, the last value of each name winning: this runs for every retried record.
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name.startswith(PREFIX):
            found[name] = b"" if value is None else value  # as last() reads it
    if not found:
        return NO_HISTORY
    try:
        return _delivery(found)
    except MalformedHeader as exc:
        raise _naming_null(exc, headers) from None


def _delivery(found: dict[str, bytes]) -> Delivery:
    get = found.get
    attempt, due, partition, offset, timestamp, first_failure = [
        _whole_number(name, get(name)) for name in _INTEGER_HEADERS]
    topic = _utf8(ORIGINAL_TOPIC, get(ORIGINAL_TOPIC))
    original: Origin | None = None
    if topic is not None or partition is not None or offset is not None:
        original = _origin_of(topic, partition, offset, timestamp)
    group = _utf8(GROUP, get(GROUP))
    if group == "":
        raise MalformedHeader(GROUP, b"", "empty group")
    target = _utf8(TARGET, get(TARGET))
    if target == "":
        raise MalformedHeader(TARGET, b"", "empty topic name")
    return Delivery(attempt or 0, first_failure, group, original, due, target)


def _origin_of(topic: str | None, partition: int | None, offset: int | None,
               timestamp: int | None) -> Origin:
    if topic and partition is not None and offset is not None:
        return Origin(topic, partition, offset, timestamp)
    parts = {ORIGINAL_TOPIC: topic, ORIGINAL_PARTITION: partition, ORIGINAL_OFFSET: offset}
    missing = [name for name, value in parts.items() if value is None]
    if missing:
        present = ", ".join(name for name, value in parts.items() if value is not None)
        raise MalformedHeader(missing[0], None, f"missing while {present} is present")
    if not topic:
        raise MalformedHeader(ORIGINAL_TOPIC, b"", "empty topic name")
    assert partition is not None and offset is not None
    return Origin(topic, partition, offset, timestamp)


def validate(headers: Sequence[tuple[str, bytes | None]]) -> None:
    """Raise MalformedHeader if any redrive header present cannot be parsed."""
    read_delivery(headers)
    reason = text_of(headers, REASON)
    if reason is not None and reason not in REASONS:
        raise MalformedHeader(REASON, last(headers, REASON), f"expected one of {REASONS}")


def cut(text: str, limit: int) -> str:
    """Trim text to at most `limit` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def replace(headers: Sequence[tuple[str, bytes | None]],
            updates: Mapping[str, str | int | bytes | None]) -> Headers:
    """Drop every header named in `updates`, then append the new values.

    Other headers, redrive's own not named, and any bytes they carry, are kept as they were and in
    their order; a None value removes the header, bytes are written as they are.
    """
    if _headers is not None:
        built = _headers.replace(headers, updates)
        if built is not None:
            return built
    return replace_python(headers, updates)


def replace_python(headers: Sequence[tuple[str, bytes | None]],
                   updates: Mapping[str, str | int | bytes | None]) -> Headers:
    """replace without the C extension: the reference, and its way for what C defers."""
    kept: Headers = [(name, value) for name, value in headers if name not in updates]
    for name, value in updates.items():
        if value is None:
            continue
        if type(value) is bytes:
            kept.append((name, value))
        else:
            kept.append((name, (value if type(value) is str else str(value)).encode()))
    return kept


def error_fields(error: ErrorInfo, *, message_limit: int, trace_limit: int) -> dict[str, str]:
    return {
        ERROR_TYPE: error.type_name,
        ERROR_MESSAGE: cut(error.message, message_limit),
        ERROR_TRACE: cut(error.trace, trace_limit),
    }


def origin_fields(origin: Origin) -> dict[str, str | int | None]:
    return {
        ORIGINAL_TOPIC: origin.topic,
        ORIGINAL_PARTITION: origin.partition,
        ORIGINAL_OFFSET: origin.offset,
        ORIGINAL_TIMESTAMP: kept_time(origin.timestamp_ms),
    }


def kept_time(timestamp_ms: int | None) -> int | None:
    """A record's timestamp as its copy's header may carry it, else None (left out). Kafka
    reports a missing timestamp as -1; a producer stamping µs writes times past the year 9999,
    which the header's reader refuses: the copy would come back malformed."""
    return timestamp_ms if timestamp_ms is not None and 0 <= timestamp_ms <= MAX_TIME_MS \
        else None
