"""Replay of the dead letters a DataFrame selects: rows of `redrive.spark.dead_letters(...)`
chosen with Spark SQL, replayed through the replay log of `redrive dlt replay`.

    failures = dead_letters(spark, "broker:9092", "orders", "billing")
    replay_selection(failures.where("error_type LIKE '%ParseError'"), "broker:9092")

Only the records' coordinates travel to the driver; `redrive.ops.replay.replay` reads the
records themselves again, so a selection replays exactly what `redrive dlt replay --record ...`
would, and each record at most once: a second replay of the same selection copies nothing.
It lives here and not in `redrive.spark` because runtimes never import on-call tools.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from redrive import kafka, topics
from redrive.errors import InvalidArgument
from redrive.ops.deadletters import DeadLetterFilter
from redrive.ops.replay import (
    TO_ORIGINAL,
    TO_RETRY,
    ReplayReport,
    first_retry_topic,
    parse_rate,
    replay,
)
from redrive.policy import RetryPolicy
from redrive.spark.dead_letter_table import COORDINATES, TABLE_GROUP, TABLE_TOPIC

_NEEDED = (*COORDINATES, TABLE_TOPIC, TABLE_GROUP)


def replay_selection(selection: Any, connection: kafka.Connection, *, to: str = TO_ORIGINAL,
                     policy: RetryPolicy | None = None, group: str | None = None,
                     keep_attempts: bool = False, dry_run: bool = False,
                     rate: str | float | None = None,
                     actor: str | None = None) -> list[ReplayReport]:
    """Replay the dead letters `selection` (a DataFrame of `dead_letters(...)` rows) selects;
    one report per dead-letter topic, none for an empty selection.

    to="original" sends each record to the topic it first came from; to="retry" to the first
    retry topic of the table's group under `policy`. The copies carry `group`, by default the
    table's group, as `redrive dlt replay --topic ... --group ...` does; `keep_attempts`, `rate`,
    `dry_run` and `actor` are as there."""
    columns = getattr(selection, "columns", None)
    if columns is None:
        raise InvalidArgument("selection", type(selection).__name__,
                              "must be a DataFrame of redrive.spark.dead_letters(...) rows")
    missing = [name for name in _NEEDED if name not in columns]
    if missing:
        raise InvalidArgument("selection", columns, f"lacks the column(s) {', '.join(missing)}; "
                              "select rows of redrive.spark.dead_letters(...) with all columns")
    if to not in (TO_RETRY, TO_ORIGINAL):
        raise InvalidArgument("to", to, f"expected {TO_RETRY!r} or {TO_ORIGINAL!r}")
    if to == TO_RETRY and policy is None:
        raise InvalidArgument("policy", policy, "replay to a retry topic needs the group's "
                              "policy, which names its first retry topic")
    if to == TO_ORIGINAL and policy is not None:
        raise InvalidArgument("policy", policy, "is not used when replaying to the original")
    if group is not None:
        topics.check_name("group", group)
    parse_rate(rate)  # a bad rate fails before the selection is collected, even an empty one

    wanted: dict[tuple[str, str, str], set[tuple[int, int]]] = defaultdict(set)
    for row in selection.select(*_NEEDED).distinct().collect():
        table = (row["dlt_topic"], row[TABLE_TOPIC], row[TABLE_GROUP])
        wanted[table].add((row["dlt_partition"], row["dlt_offset"]))
    reports = []
    for (dlt, main_topic, table_group), coordinates in sorted(wanted.items()):
        to_topic = first_retry_topic(policy, main_topic, table_group) \
            if policy is not None else None
        reports.append(replay(
            connection, dlt, to=to, to_topic=to_topic, group=group or table_group,
            keep_attempts=keep_attempts, selection=DeadLetterFilter(coordinates=frozenset(
                coordinates)), dry_run=dry_run, rate=rate, actor=actor))
    return reports
