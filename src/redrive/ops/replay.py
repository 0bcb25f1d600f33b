"""Replay dead-letter records: back into the group's first retry topic, or their original topic.

    report = replay(bootstrap, "orders.billing.dlt", to_topic=first_retry_topic(policy, "orders",
                    "billing"), group="billing", selection=make_filter(reasons=["exhausted"]))

A replayed copy keeps the record's key, value and other headers; it carries a due time of now
(so it is processed at once), the group (so other groups reading the same topic skip it), the
original coordinates, and by default a fresh attempt count and first-failure time, so that the
policy's attempts and deadline start over.

Every replay is logged in the compacted topic `redrive.replays`, keyed by the dead-letter
record's coordinates, with who, when, where to, how and the replay's id. A record that has an
entry there is not published again, so replaying the same selection twice publishes each record
once, unless asked to (`again`): the record's new entry then keeps its earlier replays in its
`history`, since compaction keeps only a key's latest entry. The copies and their log entries
are written in one Kafka transaction, so a crash leaves neither or both; the transactional id is
per dead-letter topic, so two replays of one topic at once cannot both publish: the later one
fences the earlier before reading the log.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from confluent_kafka import KafkaException, Producer

from redrive import headers as h
from redrive import kafka, topics
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError, UnknownTopic
from redrive.gc_pause import gc_paused
from redrive.kafka.ranges import RangeReadFailed, read_topic
from redrive.kafka.transactions import TransactionAborted, TransactionalProducer
from redrive.metrics import Metrics
from redrive.ops.deadletters import DeadLetterFilter, DeadLetterRecord, Reader
from redrive.policy import RetryPolicy

log = logging.getLogger("redrive.ops.replay")

REPLAY_LOG = "redrive.replays"
LOG_CONFIG = {"cleanup.policy": "compact"}
MIN_RATE = 1 / 3600  # records per second
TO_RETRY = "retry"
TO_ORIGINAL = "original"
DEFAULT_TIMEOUT_S = 30.0
# Copies and log entries are committed in chunks, so a long replay shows progress and a crash
# loses at most one chunk's work (which the next run redoes, as nothing of it was committed). Each
# chunk waits for two acknowledgements and a commit: at 100 records a chunk, an unpaced replay
# of 10,000 ran at 0.19 of a raw produce loop on noida-db (bench/ops.py).
CHUNK = 1000
# A record's earlier replays its newest log entry keeps (the count of all stays exact).
HISTORY = 100
# What the history keeps of each earlier entry: the record's own fields are the same in each.
_SUMMARY = ("replay_id", "who", "when_ms", "when", "to", "attempts", "destination")

Progress = Callable[[int, int], None]  # (records just handled, records selected)


class ReplayFailed(RedriveError):
    """The replay could not be done safely; nothing of its unfinished part was published."""


def first_retry_topic(policy: RetryPolicy, topic: str, group: str) -> str:
    """The retry topic that a record's first failure in `group` goes to under `policy`."""
    return topics.plan(policy, topic, group).retry_topic_for(1).name


def parse_rate(value: str | float | None) -> float | None:
    """Records per second from `50`, `50/s` or `600/m`; None means as fast as possible."""
    if value is None:
        return None
    if isinstance(value, int | float):
        rate = float(value)
    else:
        number, _, unit = value.strip().partition("/")
        scale = {"": 1.0, "s": 1.0, "m": 1 / 60, "h": 1 / 3600}.get(unit.strip())
        try:
            rate = float(number) * scale if scale is not None else -1.0
        except ValueError:
            rate = -1.0
    # inf cannot size a chunk, and below one an hour a pause overflows what a sleep takes.
    if not MIN_RATE <= rate < math.inf:
        raise InvalidArgument("rate", value, "expected a finite rate of at least 1/h, such as "
                              "50/s or 600/m")
    return rate


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def log_key(topic: str, partition: int, offset: int) -> str:
    # '/' cannot occur in a topic name, so the key splits back unambiguously.
    return f"{topic}/{partition}/{offset}"


@dataclass(frozen=True)
class Replayed:
    """One published copy, as written to the replay log."""

    source: tuple[str, int, int]
    destination: tuple[str, int, int]  # topic, partition, offset of the copy
    key: str | None


@dataclass(frozen=True)
class Skipped:
    source: tuple[str, int, int]
    why: str


@dataclass
class ReplayReport:
    selected: int = 0
    dry_run: bool = False
    replay_id: str | None = None  # the id its log entries carry; None for a dry run
    replayed: list[Replayed] = field(default_factory=list)
    planned: list[tuple[tuple[str, int, int], str]] = field(default_factory=list)  # dry run
    already: list[tuple[str, int, int]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True)
class Audit:
    """What each log entry of one replay says besides its record."""

    replay_id: str
    who: str
    to: str
    keep_attempts: bool


@dataclass(frozen=True)
class Target:
    """Where one copy goes: a topic, and the partition to keep if that topic has it."""

    topic: str
    partition: int | None


# Without the collector a replay of 10,000 named records took 0.72 s instead of 0.98 s (medians
# of four each, alternating; bench/ops.py's dead letters).
@gc_paused()
def replay(connection: kafka.Connection, dlt_topic: str, *, to_topic: str | None = None,
           to: str = TO_RETRY, group: str | None = None, keep_attempts: bool = False,
           selection: DeadLetterFilter | None = None, dry_run: bool = False,
           rate: str | float | None = None, actor: str | None = None, again: bool = False,
           progress: Progress | None = None, metrics: Metrics | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, named_as: str = "record") -> ReplayReport:
    """Republish the dead-letter records of `dlt_topic` that `selection` matches.

    to=TO_RETRY needs `to_topic`, the group's first retry topic (see `first_retry_topic`);
    to=TO_ORIGINAL sends each record to the topic it first came from. `group` is written on the
    copies; by default each record's own group (from its dead-letter headers) is used, and a
    record with neither is skipped, as is one with no known original or unreadable headers.
    A record replayed before is left alone, unless `again`. `progress(n, total)` is called as
    records are handled. A record `selection` names by its coordinates that the topic does not
    hold is refused, naming the field `named_as` (what the caller took them as).
    """
    if to not in (TO_RETRY, TO_ORIGINAL):
        raise InvalidArgument("to", to, f"expected {TO_RETRY!r} or {TO_ORIGINAL!r}")
    if to == TO_RETRY and not to_topic:
        raise InvalidArgument("to_topic", to_topic,
                              "replay to a retry topic needs the topic (see first_retry_topic)")
    if to == TO_ORIGINAL and to_topic:
        raise InvalidArgument("to_topic", to_topic, "is not used when replaying to the original")
    if group is not None:
        topics.check_name("group", group)
    pace = parse_rate(rate)
    admin = kafka.admin(connection)
    counts = kafka.topic_partitions(admin, timeout_s)
    if dlt_topic not in counts:
        raise UnknownTopic(dlt_topic)
    if to_topic is not None and to_topic not in counts:
        raise UnknownTopic(to_topic)
    reader = Reader(connection, dlt_topic, timeout_s)
    report = ReplayReport(dry_run=dry_run)
    if selection is not None and selection.coordinates:
        records = reader.named(selection, named_as)
    else:
        records = list(reader.records(selection or DeadLetterFilter()))
    report.selected = len(records)

    transactions: TransactionalProducer | None = None
    if not dry_run:
        if REPLAY_LOG not in counts:
            kafka.create_topics(admin, {REPLAY_LOG: 1}, config=LOG_CONFIG)
        transactions = TransactionalProducer(connection, f"redrive-replay-{dlt_topic}",
                                             timeout_s=timeout_s)
        # Before the log is read: this fences an earlier replay of the same topic still running.
        try:
            transactions.start()
        except KafkaException as exc:
            raise ReplayFailed(f"cannot start the replay transaction of {dlt_topic}: "
                               f"{exc.args[0]}") from exc
    done = read_log(connection, dlt_topic, timeout_s,
                    keys={log_key(*_coordinates(record)) for record in records})

    plans: list[tuple[DeadLetterRecord, Target, list[tuple[str, bytes | None]]]] = []
    for record in records:
        source = _coordinates(record)
        earlier = done.get(log_key(*source))
        if earlier is not None and not of_record(earlier, record):
            # Of another record at these coordinates: the topic was deleted and created again.
            del done[log_key(*source)]
        elif earlier is not None and not again:
            report.already.append(source)
            continue
        prepared = prepare_copy(record, to, to_topic, group, keep_attempts, counts)
        if isinstance(prepared, str):
            report.skipped.append(Skipped(source, prepared))
        else:
            plans.append((record, *prepared))
    if progress is not None and len(records) > len(plans):
        progress(len(records) - len(plans), len(records))

    if transactions is None:
        report.planned = [(_coordinates(r), target.topic) for r, target, _ in plans]
        if progress is not None and plans:
            progress(len(plans), len(records))
        return report

    audit = Audit(uuid.uuid4().hex[:12], actor or default_actor(), to, keep_attempts)
    report.replay_id = audit.replay_id
    started = time.monotonic()
    # A paced replay commits about once a second, so its progress shows as it goes.
    size = CHUNK if pace is None else max(1, min(CHUNK, int(pace)))
    for start in range(0, len(plans), size):
        chunk = plans[start:start + size]
        try:
            published = transactions.run(partial(
                _publish, chunk=chunk, audit=audit, earlier=done, started=started,
                done_before=start, pace=pace, timeout_s=timeout_s))
        except TransactionAborted as exc:
            raise ReplayFailed(f"replay of {dlt_topic} stopped, nothing of its last chunk "
                               f"was published: {exc}") from exc
        report.replayed.extend(published)
        if metrics is not None:
            for record, _, _ in chunk:
                origin = record.info.original if record.info else None
                metrics.replayed(origin.topic if origin else record.record.topic)
        if progress is not None:
            progress(len(chunk), len(records))
    return report


def prepare_copy(record: DeadLetterRecord, to: str, to_topic: str | None, group: str | None,
                 keep_attempts: bool,
                 counts: Mapping[str, int]) -> tuple[Target, list[tuple[str, bytes | None]]] | str:
    """The copy's destination and headers, or why the record cannot be replayed."""
    if record.problem is not None:
        return f"unreadable headers: {record.problem}"
    info = record.info
    origin = info.original if info else None
    copy_group = group or (info.group if info else None)
    if copy_group is None:
        return "no group: the record names none; give one"
    if origin is None:
        return "no original topic/partition/offset in its headers"
    destination = origin.topic if to == TO_ORIGINAL else to_topic
    assert destination is not None
    if destination not in counts:
        return f"destination topic {destination!r} does not exist"
    updates: dict[str, str | int | None] = {
        h.DUE: now_ms(),
        h.GROUP: copy_group,
        h.REASON: None,
        **h.origin_fields(origin),
    }
    if keep_attempts:
        if info is not None and info.attempts is not None:
            updates[h.ATTEMPT] = info.attempts
    else:
        updates[h.ATTEMPT] = None
        updates[h.FIRST_FAILURE] = None
    partition = topics.partition_for(origin.partition, counts[destination])
    return Target(destination, partition), h.replace(record.record.headers, updates)


def _coordinates(letter: DeadLetterRecord) -> tuple[str, int, int]:
    record = letter.record
    return record.topic, record.partition, record.offset


def _publish(producer: Producer, *,
             chunk: list[tuple[DeadLetterRecord, Target, list[tuple[str, bytes | None]]]],
             audit: Audit, earlier: Mapping[str, dict[str, Any]], started: float,
             done_before: int, pace: float | None, timeout_s: float) -> list[Replayed]:
    """The body of one transaction: the chunk's copies, then (with their offsets) their log
    entries, each keeping its record's `earlier` entry in its history."""
    copies = [kafka.OutRecord(target.topic, letter.record.value, letter.record.key, headers,
                              target.partition) for letter, target, headers in chunk]
    if pace is None:
        delivered = kafka.produce_confirmed(producer, copies, timeout_s)
    else:
        delivered = []
        for index, copy in enumerate(copies):
            wait = started + (done_before + index) / pace - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            delivered += kafka.produce_confirmed(producer, [copy], timeout_s)
    published: list[Replayed] = []
    entries: list[kafka.OutRecord] = []
    when = now_ms()
    for (letter, _, _), landed in zip(chunk, delivered, strict=True):
        key = letter.record.key
        item = Replayed(_coordinates(letter), (landed.topic, landed.partition, landed.offset),
                        None if key is None else key.decode("utf-8", "replace"))
        published.append(item)
        log_id = log_key(*item.source)
        entries.append(kafka.OutRecord(
            REPLAY_LOG, json.dumps(_entry(item, letter, audit, when, earlier.get(log_id)),
                                   sort_keys=True).encode(), log_id.encode()))
    kafka.produce_confirmed(producer, entries, timeout_s)
    return published


def _entry(item: Replayed, record: DeadLetterRecord, audit: Audit, when_ms: int,
           before: Mapping[str, Any] | None) -> dict[str, Any]:
    info = record.info
    return {
        "replay_id": audit.replay_id,
        "who": audit.who,
        "when_ms": when_ms,
        "when": datetime.fromtimestamp(when_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        "source": {"topic": item.source[0], "partition": item.source[1],
                   "offset": item.source[2], "timestamp_ms": record.record.timestamp_ms},
        "destination": {"topic": item.destination[0], "partition": item.destination[1],
                        "offset": item.destination[2]},
        "to": audit.to,
        "attempts": "kept" if audit.keep_attempts else "reset",
        "reason": record.reason,
        "error_type": record.error_type,
        "system": info.system if info else None,
        **_history(before),
    }


def _history(before: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a record's new log entry that keep its earlier replays (`before`: its
    latest entry so far)."""
    if before is None:
        return {}
    earlier = [*before.get("history", []), _summary(before)]
    return {"history": earlier[-HISTORY:], "replays": before.get("replays", 1) + 1}


def _summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {name: entry.get(name) for name in _SUMMARY}


def of_record(entry: Mapping[str, Any], letter: DeadLetterRecord) -> bool:
    """Whether a log entry is of this record, not of one that held its coordinates before its
    topic was deleted and created again (offsets start over; the timestamp tells them apart).
    An entry from before timestamps were kept is taken to be."""
    source = entry.get("source")
    stamp = source.get("timestamp_ms") if isinstance(source, dict) else None
    return stamp is None or stamp == letter.record.timestamp_ms


def replays_of(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every replay of a record that its latest log entry keeps, newest first: at most
    HISTORY + 1 of them (`entry["replays"]`, when present, counts them all)."""
    return [_summary(entry), *reversed(entry.get("history", []))]


# The fields of an entry that replays and the console compute with, by the type they need.
_FIELD_TYPES: Mapping[str, type] = {"when_ms": int, "replays": int, "history": list,
                                    "source": dict, "destination": dict}
# Those of its source and destination: the console builds links and text of them.
_PLACE_TYPES: Mapping[str, type] = {"topic": str, "partition": int, "offset": int,
                                    "timestamp_ms": int}


def _read_entry(value: bytes) -> dict[str, Any] | None:
    """A log entry, or None for a value that is not one (written by hand or by another tool)."""
    try:
        entry = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not _typed(entry, _FIELD_TYPES) or not all(
            _typed(entry.get(place, {}), _PLACE_TYPES) for place in ("source", "destination")):
        return None
    return entry if all(isinstance(item, dict) for item in entry.get("history", [])) else None


def _typed(fields: Mapping[str, Any], types: Mapping[str, type]) -> bool:
    """Whether each of `types`' fields present in `fields` is of its type."""
    return all(name not in fields or isinstance(fields[name], kind)
               for name, kind in types.items())


def read_log(connection: kafka.Connection, dlt_topic: str | None = None,
             timeout_s: float = DEFAULT_TIMEOUT_S, *, strict: bool = True,
             keys: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """The replay log's entries (of `dlt_topic` only, if given; of `keys` only, if given),
    latest per key. An entry that is not redrive's raises ReplayFailed; not `strict` (for a
    listing) it is logged and left out."""
    counts = kafka.topic_partitions(kafka.admin(connection), timeout_s)
    if REPLAY_LOG not in counts:
        return {}
    prefix = f"{dlt_topic}/" if dlt_topic else ""
    entries: dict[str, dict[str, Any]] = {}
    try:
        # Strict, the log is read whole: another topic's replay may hold a transaction open on
        # it (running, or crashed: until its transaction.timeout.ms), and the entries committed
        # after that transaction began would be missed, their records published twice.
        for message in read_topic(connection, REPLAY_LOG, counts[REPLAY_LOG], idle_s=timeout_s,
                                  whole=strict):
            key = (message.key() or b"").decode("utf-8", "replace")
            # The others are not decoded: the log keeps every record ever replayed, and a
            # replay needs only its selection's (bench/replay_log.py: 200,000 entries of one
            # topic, 4.0 s decoded, 0.5 s for one record's).
            if key.startswith(prefix) and (keys is None or key in keys):
                value = message.value()
                if value is None:
                    entries.pop(key, None)  # a tombstone: the entry was deleted
                elif (entry := _read_entry(value)) is not None:
                    entries[key] = entry
                else:
                    bad = (f"{REPLAY_LOG}[{message.partition()}]@{message.offset()} (key "
                           f"{key!r}) is not a replay log entry: {value[:80]!r}")
                    if strict:  # skipped, its record could be published twice
                        raise ReplayFailed(f"{bad}; rather than risk publishing its record "
                                           "twice, nothing is replayed")
                    log.warning("%s; left out", bad)
                    entries.pop(key, None)
    except RangeReadFailed as exc:
        # A partial log would let a record be published twice.
        raise ReplayFailed(f"could not read {REPLAY_LOG} to its end: {exc} (if a transaction "
                           "left open on it holds the read back, another replay's running or "
                           "crashed, try again once it ends: within its "
                           "transaction.timeout.ms)") from exc
    return entries
