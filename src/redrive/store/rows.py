"""What the retry store holds and how rows are picked: a stored row, an entry a runtime writes,
a success it reports, and the filter the CLI and queries narrow rows with."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Row, and_, or_, true

from redrive import headers as h
from redrive.errors import InvalidArgument, RedriveError
from redrive.store.schema import DEAD, MODES, PARKED, PENDING, STATUSES, retries

log = logging.getLogger("redrive.store")

Headers = list[tuple[str, bytes | None]]
Coordinates = tuple[str, int, int]  # a record's original topic, partition and offset

# redrive's headers that a republished copy takes from its row's columns (the scheduler writes
# them anew), left out of a row's stored headers: they would store the trace a second time,
# base64-encoded, and each row is rewritten three times on its way through the store.
FROM_COLUMNS = frozenset({h.ATTEMPT, h.DUE, h.GROUP, h.FIRST_FAILURE, h.ORIGINAL_TOPIC,
                          h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET, h.ORIGINAL_TIMESTAMP,
                          h.ERROR_TYPE, h.ERROR_MESSAGE, h.ERROR_TRACE, h.REASON, h.TARGET})


def key_digest(key: bytes | None) -> str | None:
    return None if key is None else hashlib.sha1(key, usedforsecurity=False).hexdigest()


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """JSON [name, base64 value] pairs; a null value as JSON null."""
    return json.dumps([[name, None if value is None else base64.b64encode(value).decode()]
                       for name, value in headers])


def stored_headers(headers: Sequence[tuple[str, bytes | None]]) -> Headers:
    """What a row keeps of a record's headers: all but those its columns give (FROM_COLUMNS)."""
    return [(name, value) for name, value in headers if name not in FROM_COLUMNS]


def decode_headers(raw: str | None) -> Headers:
    """A row's headers column read back; raises ValueError (saying what is wrong) on a column
    that is not what encode_headers writes."""
    try:
        pairs = json.loads(raw or "[]")
        # binascii's own decoder: base64.b64decode's argument checks cost as much again.
        headers: Headers = [(name, None if value is None else binascii.a2b_base64(value))
                            for name, value in pairs]
    except (ValueError, TypeError) as exc:  # not JSON, not base64, not pairs
        raise ValueError(f"not a JSON list of [name, base64 value] pairs ({exc})") from exc
    if type(pairs) is not list or not all(type(name) is str for name, _ in headers):
        raise ValueError("not a JSON list of [name, base64 value] pairs")
    return headers


class CorruptRow(RedriveError):
    """A stored row whose headers column cannot be read (edited by hand, or written by
    something other than redrive). `row` is the rest of it, with no headers."""

    def __init__(self, row: StoredRetry, raw: object, problem: str) -> None:
        self.row = row
        shown = raw if not isinstance(raw, str) or len(raw) <= 80 else raw[:80] + "..."
        super().__init__(f"stored retry {row.id}: invalid headers={shown!r}: {problem}")


@dataclass(frozen=True)
class StoredRetry:
    """One row of the store, as the scheduler, the CLI and notification hooks see it."""

    id: int
    group: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    mode: str
    value: bytes | None
    headers: Headers
    target: str | None
    attempt: int
    first_failure_ms: int | None
    due_ms: int
    status: str
    reason: str | None
    error_type: str | None
    error_message: str | None
    error_trace: str | None
    created_ms: int
    updated_ms: int
    dispatched_ms: int | None
    dispatches: int

    @classmethod
    def of(cls, row: Row[Any]) -> StoredRetry:
        """The row as a StoredRetry; raises CorruptRow when its headers cannot be read."""
        # By position: 23 lookups by name on the row's mapping cost the scheduler more per row
        # (about 10 us) than the dataclass and the headers' decoding together.
        if len(row) != _ROW_LENGTH:
            raise ValueError(f"a stored retry is built from a whole row of {retries.name!r} "
                             f"({_ROW_LENGTH} columns), not {len(row)}: {row._fields}")
        values = [row[i] for i in _POSITIONS]
        raw = values[_HEADERS_AT]
        try:
            values[_HEADERS_AT] = decode_headers(raw)
            problem = None
        except ValueError as exc:
            values[_HEADERS_AT], problem = [], str(exc)
        # Filled as one dict update: a frozen dataclass's __init__ sets each of the 23 fields
        # through object.__setattr__ (3.4 against 1.3 us a row).
        built = object.__new__(cls)
        built.__dict__.update(zip(_COLUMN_FIELDS, values, strict=True))
        if problem is not None:
            raise CorruptRow(built, raw, problem)
        return built

    @classmethod
    def shown(cls, row: Row[Any]) -> StoredRetry:
        """The row for a listing: one whose headers cannot be read is shown without them."""
        try:
            return cls.of(row)
        except CorruptRow as exc:
            log.warning("%s; shown without its headers", exc)
            return exc.row

    @property
    def destination(self) -> str:
        return self.target or self.topic


def row_positions(*columns: str) -> tuple[int, ...]:
    """Where these columns are in a whole row of the table (`select(retries)`, or a claim's
    RETURNING of every column): a Row's lookup by name costs more than the work on it."""
    names = list(retries.columns.keys())
    return tuple(names.index(column) for column in columns)


# StoredRetry's fields, in their order, and where each is in a whole row (every field is its
# column but `group`, which is `group_id`).
_COLUMN_FIELDS = tuple(field.name for field in fields(StoredRetry))
_POSITIONS = row_positions(*("group_id" if name == "group" else name for name in _COLUMN_FIELDS))
_ROW_LENGTH = len(retries.columns)
_HEADERS_AT = _COLUMN_FIELDS.index("headers")


class RecordState(NamedTuple):
    """Where a record's row stands: what a runtime needs to tell a copy to handle from one to
    skip."""

    status: str
    attempt: int


@dataclass(frozen=True)
class Entry:
    """A record the runtime puts into the store: failed (pending or dead) or parked behind its key.

    In reference mode `value` and `headers` are None: the scheduler reads the record back.
    """

    group: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    mode: str
    value: bytes | None
    headers: Headers | None
    target: str | None
    attempt: int
    first_failure_ms: int | None
    due_ms: int
    status: str
    reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_trace: str | None = None
    # The group keeps per-key order: a dead entry lets the next record parked behind it go.
    ordered: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument("mode", self.mode, f"expected one of {MODES}")
        if self.status not in (PENDING, DEAD, PARKED):
            raise InvalidArgument("status", self.status, "an entry is pending, dead or parked")


@dataclass(frozen=True)
class Success:
    """A record the store dispatched was handled: its row (at this attempt) has succeeded.

    `key` is given when the group keeps per-key order (the next parked record then goes), else
    None: nothing can be parked behind it, and no lookup is spent on it.
    """

    group: str
    topic: str
    partition: int
    offset: int
    attempt: int
    key: bytes | None


@dataclass(frozen=True)
class RowFilter:
    """Which rows a CLI command or query looks at; every field given narrows it."""

    ids: tuple[int, ...] = ()
    group: str | None = None
    topic: str | None = None
    statuses: tuple[str, ...] = ()
    error_type: str | None = None
    older_than_ms: int | None = None  # stored at least this long ago
    newer_than_ms: int | None = None

    def __post_init__(self) -> None:
        for status in self.statuses:
            if status not in STATUSES:
                raise InvalidArgument("status", status, f"expected one of {STATUSES}")
        for name in ("older_than_ms", "newer_than_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidArgument(name, value, "must be >= 0")

    @property
    def narrows(self) -> bool:
        return bool(self.ids or self.group or self.topic or self.statuses or self.error_type
                    or self.older_than_ms is not None or self.newer_than_ms is not None)

    def where(self, now: int) -> ColumnElement[bool]:
        c = retries.c
        parts: list[ColumnElement[bool]] = []
        if self.ids:
            parts.append(c.id.in_(self.ids))
        if self.group is not None:
            parts.append(c.group_id == self.group)
        if self.topic is not None:
            parts.append(c.topic == self.topic)
        if self.statuses:
            parts.append(c.status.in_(self.statuses))
        if self.error_type is not None:
            # "TimeoutError" finds "builtins.TimeoutError" and "app.errors.TimeoutError" alike.
            # '%' and '_' in a type name are themselves, not LIKE wildcards.
            escaped = (self.error_type.replace("\\", "\\\\").replace("%", "\\%")
                       .replace("_", "\\_"))
            parts.append(or_(c.error_type == self.error_type,
                             c.error_type.like(f"%.{escaped}", escape="\\")))
        if self.older_than_ms is not None:
            parts.append(c.created_ms <= now - self.older_than_ms)
        if self.newer_than_ms is not None:
            parts.append(c.created_ms >= now - self.newer_than_ms)
        return and_(true(), *parts)


EVERY_ROW = RowFilter()
