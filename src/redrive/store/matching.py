"""Conditions that pick the store's rows: records by their original coordinates and keys by their
digest, each shaped so that an index serves it, in statements of at most LOOKUP_CHUNK items."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TypeVar

from sqlalchemy import ColumnElement, and_, any_, bindparam, or_
from sqlalchemy.dialects.postgresql import ARRAY

from redrive.store.rows import Coordinates, Success, key_digest
from redrive.store.schema import retries

# Records or keys looked up per statement by the bulk lookups: a poll batch's worth, with every
# database's limit on bound parameters far away.
LOOKUP_CHUNK = 500
_T = TypeVar("_T")


def one_of(column: ColumnElement[_T], values: Sequence[_T], dialect: str
           ) -> ColumnElement[bool]:
    """`column IN values`, on PostgreSQL as one array parameter. A list becomes a parameter
    each, rendered and converted on every call: a scheduler's settle of 500 ids took 12-15 us
    an id that way against 4-5 with the array. On SQLite the list stays (an array would need its
    JSON functions, for about 1.5 us an id)."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(column.type)))
    return column.in_(values)


def record_is(group: str, topic: str, partition: int, offset: int) -> ColumnElement[bool]:
    c = retries.c
    return and_(c.group_id == group, c.topic == topic, c.partition == partition,
                c.offset == offset)


def each_partition(chunk: Sequence[Coordinates], dialect: str
                   ) -> Iterator[ColumnElement[bool]]:
    """These records, as one condition per partition: `topic = t AND partition = p AND offset
    IN (...)`, which the record index serves. ORed into one statement they are not: the planner
    then reads every row of the group and topic (a table's whole history) and filters them."""
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, partition, offset in chunk:
        offsets[(topic, partition)].append(offset)
    c = retries.c
    for (topic, partition), listed in offsets.items():
        yield and_(c.topic == topic, c.partition == partition,
                   one_of(c.offset, listed, dialect))


def each_attempt(chunk: Sequence[Success], dialect: str) -> Iterator[ColumnElement[bool]]:
    """These records at their attempt, as one condition per partition and attempt (see
    each_partition)."""
    offsets: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for success in chunk:
        offsets[(success.topic, success.partition, success.attempt)].append(success.offset)
    c = retries.c
    for (topic, partition, attempt), listed in offsets.items():
        yield and_(c.topic == topic, c.partition == partition,
                   one_of(c.offset, listed, dialect), c.attempt == attempt)


def any_key(chunk: Sequence[tuple[str, str | None]]) -> ColumnElement[bool]:
    """One of these (topic, key digest): a digest list per topic, served by the key index."""
    digests: dict[str, list[str | None]] = defaultdict(list)
    for topic, digest in chunk:
        digests[topic].append(digest)
    c = retries.c
    return or_(*(and_(c.topic == topic, c.key_digest.in_(listed))
                 for topic, listed in digests.items()))


def key_is(group: str, topic: str, key: bytes | None) -> ColumnElement[bool]:
    c = retries.c
    return and_(c.group_id == group, c.topic == topic, c.key_digest == key_digest(key))


def chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), LOOKUP_CHUNK):
        yield items[start:start + LOOKUP_CHUNK]
