"""redrive's headers decoded into a `redrive` struct column, in Spark SQL.

The DataFrame form of the pipeline must not run Python per record, so the headers are read with
Spark's own functions: the last value of each header wins, as in `headers.read_delivery`, and a
header `read_delivery` would refuse names itself in `redrive.malformed`. The two agree on what
redrive and other well-behaved writers put there (a test runs both over the same malformed
headers); at the far edges SQL is the stricter (an integer past 64 bits, non-ASCII whitespace
around a number), which only sends such a record to the dead-letter topic as `malformed`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from redrive import headers as h
from redrive.spark.sql import functions

REDRIVE_COLUMN = "redrive"
# Fields of the struct, in order; times are timestamps, as Spark users compare them.
FIELDS = ("attempt", "first_failure", "original_topic", "original_partition", "original_offset",
          "original_timestamp", "due", "group", "target", "malformed")
_INTEGER = r"^\s*-?[0-9]{1,19}\s*$"


def _last(F: ModuleType, name: str) -> Any:
    """The header's last value (binary), null when the record does not carry it."""
    found = F.filter("headers", lambda pair: pair["key"] == F.lit(name))
    return F.try_element_at(found, F.lit(-1)).getField("value")


def _integer(F: ModuleType, name: str) -> tuple[Any, Any]:
    """The header as a long, and whether it is present but not a whole number >= 0."""
    raw = _last(F, name)
    text = raw.cast("string")
    value = F.when(F.regexp_like(text, F.lit(_INTEGER)), F.trim(text).try_cast("long"))
    bad = raw.isNotNull() & (value.isNull() | (value < 0))
    return value, bad


def _text(F: ModuleType, name: str) -> tuple[Any, Any, Any]:
    """The header as text, whether it is not UTF-8, and whether it is empty."""
    raw = _last(F, name)
    return raw.cast("string"), raw.isNotNull() & ~F.is_valid_utf8(raw), F.length(raw) == 0


def with_redrive_columns(frame: Any) -> Any:
    """`frame` (with the source's `headers` column) plus the `redrive` struct column."""
    F = functions(frame)

    attempt, bad_attempt = _integer(F, h.ATTEMPT)
    due, bad_due = _integer(F, h.DUE)
    partition, bad_partition = _integer(F, h.ORIGINAL_PARTITION)
    offset, bad_offset = _integer(F, h.ORIGINAL_OFFSET)
    stamp, bad_stamp = _integer(F, h.ORIGINAL_TIMESTAMP)
    first, bad_first = _integer(F, h.FIRST_FAILURE)
    topic, topic_not_utf8, topic_empty = _text(F, h.ORIGINAL_TOPIC)
    group, group_not_utf8, group_empty = _text(F, h.GROUP)
    target, target_not_utf8, target_empty = _text(F, h.TARGET)
    origin = [(h.ORIGINAL_TOPIC, _last(F, h.ORIGINAL_TOPIC)),
              (h.ORIGINAL_PARTITION, _last(F, h.ORIGINAL_PARTITION)),
              (h.ORIGINAL_OFFSET, _last(F, h.ORIGINAL_OFFSET))]
    any_origin = origin[0][1].isNotNull() | origin[1][1].isNotNull() | origin[2][1].isNotNull()
    checks = [
        (bad_attempt, f"{h.ATTEMPT}: expected a decimal integer >= 0"),
        (bad_due, f"{h.DUE}: expected a decimal integer >= 0"),
        (bad_partition, f"{h.ORIGINAL_PARTITION}: expected a decimal integer >= 0"),
        (bad_offset, f"{h.ORIGINAL_OFFSET}: expected a decimal integer >= 0"),
        (bad_stamp, f"{h.ORIGINAL_TIMESTAMP}: expected a decimal integer >= 0"),
        (bad_first, f"{h.FIRST_FAILURE}: expected a decimal integer >= 0"),
        (topic_not_utf8, f"{h.ORIGINAL_TOPIC}: not UTF-8 text"),
        *[(any_origin & raw.isNull(), f"{name}: missing while another original header is present")
          for name, raw in origin],
        (topic_empty, f"{h.ORIGINAL_TOPIC}: empty topic name"),
        (group_not_utf8, f"{h.GROUP}: not UTF-8 text"),
        (group_empty, f"{h.GROUP}: empty group"),
        (target_not_utf8, f"{h.TARGET}: not UTF-8 text"),
        (target_empty, f"{h.TARGET}: empty topic name"),
    ]
    malformed = F.coalesce(*(F.when(bad, F.lit(why)) for bad, why in checks))
    fields = [
        F.when(~bad_attempt, F.coalesce(attempt, F.lit(0))).otherwise(0).cast("int"),
        F.timestamp_millis(first),
        topic,
        partition.cast("int"),
        offset,
        F.timestamp_millis(stamp),
        F.timestamp_millis(due),
        group,
        target,
        malformed,
    ]
    # Most records carry no redrive header at all: one test instead of ten lookups for them.
    plain = F.struct(F.lit(0).alias("attempt"),
                     *(F.lit(None).cast(kind).alias(name) for name, kind in _PLAIN_TYPES))
    decoded = F.struct(*(value.alias(name) for value, name in zip(fields, FIELDS, strict=True)))
    carries = F.exists("headers", lambda pair: pair["key"].startswith(h.PREFIX))
    return frame.withColumn(REDRIVE_COLUMN, F.when(carries, decoded).otherwise(plain))


_PLAIN_TYPES = [("first_failure", "timestamp"), ("original_topic", "string"),
                ("original_partition", "int"), ("original_offset", "long"),
                ("original_timestamp", "timestamp"), ("due", "timestamp"), ("group", "string"),
                ("target", "string"), ("malformed", "string")]
