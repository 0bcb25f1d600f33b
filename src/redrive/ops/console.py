"""What the operations console (`redrive ui`, served by `redrive.ops.web`) reads and does, over
the dead-letter, replay, stats and store tools: the groups' health, pages of dead letters grouped
by cause, replays and store actions, each checked against the console's token."""

from __future__ import annotations

import heapq
import hmac
import json
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import re2
from confluent_kafka import KafkaException
from fastapi import HTTPException
from pydantic import BaseModel, Field

from redrive import kafka, topics
from redrive.errors import InvalidArgument, RedriveError
from redrive.gc_pause import gc_paused
from redrive.ops import activity, stats, waiting
from redrive.ops.activity import Activity
from redrive.ops.deadletters import (
    DeadLetterFilter,
    DeadLetterRecord,
    Reader,
    make_filter,
    parse_coordinates,
    text,
)
from redrive.ops.replay import (
    TO_ORIGINAL,
    TO_RETRY,
    ReplayReport,
    log_key,
    of_record,
    read_log,
    replay,
    replays_of,
)
from redrive.ops.stats import discover_retry_topics
from redrive.ops.waiting import DEFAULT_DELAY, DelayTiers, Waiting
from redrive.store import RetryStore
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD, PENDING, STATUSES

log = logging.getLogger(__name__)

PAGE_SIZE = 50
# The web app refuses a page past this (50,000 records back): a page number is read without a
# token, and a huge one would read the whole topic into memory. `everything` reads it all too,
# but only as far as the topic goes, which its page also offers.
MAX_PAGE = 1000
# Records per partition read first when a page is asked for; each further step reads four times
# as many, further back.
FIRST_STEP = 500
_DLT_SUFFIX = f"{topics.SEPARATOR}dlt"
# Numbers, hex ids and UUIDs vary between failures of one cause: a fingerprint leaves them out.
_VARYING = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}\b|\b0x[0-9a-fA-F]+\b|\d+")


def fingerprint(error_type: str | None, message: str | None) -> str:
    """What failures of one cause share: the error type and the message without its numbers
    and ids."""
    return f"{error_type or '?'}: {_VARYING.sub('#', message or '')}"


@dataclass(frozen=True)
class DeadLetterTopic:
    name: str
    topic: str | None  # the main topic and group, when the name follows redrive's naming
    group: str | None
    records: int


@dataclass(frozen=True)
class GroupHealth:
    """One group's retries and dead letters for one main topic, as the overview shows them."""

    topic: str
    group: str
    dead_letter_topic: str
    lag: int | None  # main topic: end minus committed; None before the group's first commit
    waiting_retries: int  # records in the group's retry topics it has not finished
    retry_topics: int
    oldest_waiting_ms: int | None  # the timestamp of the oldest of them
    next_due_ms: int | None
    dead_letters: int
    problem: str | None = None  # why the group's figures could not be read
    activity: Activity | None = None  # what its topics received over the last hour and day
    # Its retries waiting in the retry store or in the delay service's tiers.
    elsewhere: tuple[Waiting, ...] = ()
    # Where its waiting retries could not be looked for (the store, the delay tiers), and why.
    elsewhere_problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "activity": self.activity.to_json() if self.activity else None,
                "elsewhere": [asdict(waiting) for waiting in self.elsewhere]}


@dataclass(frozen=True)
class Group:
    fingerprint: str
    count: int
    first_ms: int
    last_ms: int


@dataclass(frozen=True)
class View:
    """A page of a dead-letter topic's records that a filter selects, newest first.

    The topic is read from its end backwards, in growing steps, only until the page is filled
    (and no unread record can come before the page's last), unless `everything` was asked: so
    a first page of a large topic comes at once. `matched` and `groups` then count the part read
    (`read` records of `size`); `complete` says whether that was the whole topic.
    """

    letters: list[DeadLetterRecord]
    matched: int
    groups: list[Group]
    read: int
    size: int

    @property
    def complete(self) -> bool:
        return self.read >= self.size


@dataclass(frozen=True)
class Selection:
    """The dead letters a filter selects; every condition given must hold (empty: all)."""

    reason: str | None = None
    error_type: str | None = None
    since: str | None = None  # a duration back from now (2h) or an ISO time
    until: str | None = None
    contains: str | None = None  # a substring of the key, a header or the value
    fingerprint: str | None = None
    # A regular expression searched in the error message, run by RE2: its time grows with the
    # message's length only, so no pattern can hold the server.
    message: str | None = None

    def matcher(self) -> Callable[[DeadLetterRecord], bool]:
        """The test of a record; raises InvalidArgument naming a time or a regular expression
        that cannot be read."""
        where = make_filter(reasons=[self.reason] if self.reason else [],
                            error_types=[self.error_type] if self.error_type else [],
                            since=self.since or None, until=self.until or None)
        message = _pattern("message", self.message)
        return lambda letter: (where.matches(letter) and _contains(letter, self.contains) and (
            not self.fingerprint or _fingerprint_of(letter) == self.fingerprint) and (
            message is None or _message_matches(letter, message)))

    @property
    def empty(self) -> bool:
        return not any(vars(self).values())


class StoreAction(BaseModel):
    group: str
    topic: str | None = None
    status: str = Field(description="The rows acted on: 'dead' or 'pending'.")


class ReplayRequest(BaseModel):
    dlt: str = Field(description="The dead-letter topic to replay from.")
    records: list[str] = Field(default=[], description="PARTITION:OFFSET of each record; "
                               "empty: every record the filter selects.")
    reason: str | None = None
    error_type: str | None = None
    fingerprint: str | None = None
    contains: str | None = Field(default=None, description="A substring of the key, a header "
                                 "or the value.")
    message: str | None = Field(default=None, description="A regular expression searched in "
                                "the error message (RE2 syntax: no backreferences or "
                                "lookaround).")
    since: str | None = Field(default=None, description="A duration (2h) or an ISO time.")
    until: str | None = Field(default=None, description="A duration (30m: that long ago) or "
                              "an ISO time.")
    to: str = Field(default=TO_ORIGINAL, description="'original' or 'retry' (the group's "
                    "first retry topic).")
    dry_run: bool = True
    rate: str | None = Field(default=None, description="Records per second, e.g. 50/s.")
    again: bool = Field(default=False, description="Also records replayed before (each "
                        "replay stays in the record's history); by default they are left.")

    @property
    def selection(self) -> Selection:
        return Selection(reason=self.reason, error_type=self.error_type, since=self.since,
                         until=self.until, contains=self.contains, fingerprint=self.fingerprint,
                         message=self.message)


class Console:
    """What the pages and the API read and do, over one cluster."""

    def __init__(self, connection: kafka.Connection, *, token: str | None,
                 store: RetryStore | None = None, delay: DelayTiers = DEFAULT_DELAY,
                 timeout_s: float = 10.0) -> None:
        self.connection = connection
        self.token = token or None
        self.store = store
        self.delay = delay
        self.timeout_s = timeout_s

    # --- reading -------------------------------------------------------------------------------

    def dead_letter_topics(self) -> list[DeadLetterTopic]:
        counts = kafka.topic_partitions(kafka.admin(self.connection), self.timeout_s)
        names = sorted(name for name in counts if name.endswith(_DLT_SUFFIX))
        consumer = kafka.consumer(self.connection)
        try:
            found = []
            for name in names:
                size = 0
                for partition in range(counts[name]):
                    low, high = kafka.watermarks(consumer, name, partition, self.timeout_s)
                    size += high - low
                topic, group = topics.dead_letter_owner(name, counts) or (None, None)
                found.append(DeadLetterTopic(name, topic, group, size))
            return found
        finally:
            consumer.close()

    def groups(self) -> list[GroupHealth]:
        """Every group with a dead-letter topic, and its health; the store and the delay tiers
        are read once for all of them."""
        found = self.dead_letter_topics()
        sources: list[tuple[str, Callable[[], dict[waiting.Key, Waiting]]]] = [
            ("the delay tiers", lambda: waiting.in_delay_tiers(self.connection, self.delay,
                                                               self.timeout_s))]
        store = self.store
        if store is not None:
            sources.append(("the retry store", lambda: waiting.in_store(store)))
        elsewhere: dict[waiting.Key, list[Waiting]] = {}
        problems: list[str] = []
        for where, read in sources:
            # One source down still leaves the groups and the other source worth showing.
            try:
                source = read()
            except (KafkaException, RedriveError) as exc:
                problems.append(f"{where} cannot be read: {exc}")
                continue
            for key, waits in source.items():
                elsewhere.setdefault(key, []).append(waits)
        return [replace(self._health_of(one),
                        elsewhere=tuple(elsewhere.get((one.group or "", one.topic or ""), ())),
                        elsewhere_problems=tuple(problems))
                for one in found]

    def _health_of(self, found: DeadLetterTopic) -> GroupHealth:
        try:
            return self.health(found)
        except Exception as exc:
            # Whatever one group's topics hold, the overview still shows every other group.
            log.exception("the figures of %s cannot be read", found.name)
            return GroupHealth(found.topic or "", found.group or "", found.name, None, 0, 0,
                               None, None, found.records,
                               f"its figures cannot be read: {exc.__cause__ or exc}")

    def health(self, found: DeadLetterTopic) -> GroupHealth:
        """The figures of `redrive stats` for the group a dead-letter topic belongs to, and
        what its topics received over the last hour and day."""
        if found.topic is None or found.group is None:
            return GroupHealth("", "", found.name, None, 0, 0, None, None, found.records,
                               "not named <topic>.<group>.dlt")
        try:
            rows = stats.collect(self.connection, found.topic, found.group,
                                 timeout_s=self.timeout_s)
        except (KafkaException, RedriveError) as exc:
            return GroupHealth(found.topic, found.group, found.name, None, 0, 0, None, None,
                               found.records, str(exc))
        recent, problem = None, None
        try:
            recent = activity.measure(self.connection, rows, self.timeout_s)
        except (KafkaException, RedriveError) as exc:
            # The group's state is still worth showing without its history.
            problem = f"its last hour and day cannot be read: {exc}"
        main = [row for row in rows if row.role == stats.MAIN]
        retries = [row for row in rows if row.role == stats.RETRY]
        oldest = [row.oldest_ms for row in retries if row.oldest_ms is not None]
        dues = [row.next_due_ms for row in retries if row.next_due_ms is not None]
        return GroupHealth(found.topic, found.group, found.name,
                           main[0].lag if main else None, sum(r.waiting for r in retries),
                           len(retries), min(oldest, default=None), min(dues, default=None),
                           found.records, problem, recent)

    def store_rows(self) -> list[dict[str, Any]]:
        """Rows of the retry store per group and topic, by status."""
        if self.store is None:
            raise InvalidArgument("store", None, "the console was started without --store-url")
        return [{"group": group, "topic": topic, **{s: counts.get(s, 0) for s in STATUSES}}
                for (group, topic), counts in sorted(self.store.counts_by_group().items())]

    def store_act(self, action: str, wanted: StoreAction) -> int:
        """Requeue a group's dead rows, or cancel its pending ones; return how many."""
        if self.store is None:
            raise InvalidArgument("store", None, "the console was started without --store-url")
        if action not in ("requeue", "cancel"):
            raise InvalidArgument("action", action, "expected 'requeue' or 'cancel'")
        where = RowFilter(group=wanted.group, topic=wanted.topic or None,
                          statuses=(wanted.status,))
        if action == "requeue" and wanted.status == DEAD:
            return self.store.requeue(where)
        if action == "cancel" and wanted.status == PENDING:
            return self.store.cancel(where)
        raise InvalidArgument("status", wanted.status, f"{action} acts on "
                              f"{DEAD if action == 'requeue' else PENDING!r} rows")

    def replays(self, dlt: str | None = None) -> list[dict[str, Any]]:
        """The replay log's entries (of one dead-letter topic, if given), newest first."""
        entries = list(read_log(self.connection, dlt, self.timeout_s, strict=False).values())
        return sorted(entries, key=lambda entry: entry.get("when_ms", 0), reverse=True)

    def record_replays(self, letter: DeadLetterRecord) -> list[dict[str, Any]]:
        """Every replay of one record the replay log keeps, newest first."""
        record = letter.record
        key = log_key(record.topic, record.partition, record.offset)
        entry = read_log(self.connection, record.topic, self.timeout_s, strict=False,
                         keys={key}).get(key)
        return replays_of(entry) if entry is not None and of_record(entry, letter) else []

    @gc_paused()
    def letters(self, dlt: str, selection: Selection) -> list[DeadLetterRecord]:
        """The records of `dlt` the filter selects, newest first."""
        matches = selection.matcher()
        found = [letter for letter in Reader(self.connection, dlt, self.timeout_s).records()
                 if matches(letter)]
        found.sort(key=lambda letter: (letter.record.timestamp_ms, letter.record.offset),
                   reverse=True)
        return found

    # A page that reads the whole of 100,000 dead letters: 1.73 s without the collector, 2.33 s
    # with it (medians of three each, alternating).
    @gc_paused()
    def view(self, dlt: str, selection: Selection, *, page: int = 1,
             everything: bool = False) -> View:
        matches = selection.matcher()
        reader = Reader(self.connection, dlt, self.timeout_s)
        marks = reader.marks()
        size = sum(high - low for low, high in marks.values())
        wanted = page * PAGE_SIZE
        ends = {partition: high for partition, (_, high) in marks.items()}
        step = max(FIRST_STEP, wanted)
        # Each partition's records read so far, from its end back; those the filter leaves out
        # are kept by timestamp only, as the merge still steps past them.
        streams: dict[int, list[_Read]] = {partition: [] for partition in marks}
        read = 0
        ordered: list[DeadLetterRecord] | None = None
        while True:
            window = {partition: (max(marks[partition][0], end - step), end)
                      for partition, end in ends.items() if end > marks[partition][0]}
            if not window:
                break
            fetched: dict[int, list[_Read]] = {partition: [] for partition in window}
            for letter in reader.ranges(window):
                record = letter.record
                fetched[record.partition].append(
                    (record.timestamp_ms, record.offset, letter if matches(letter) else None))
            for partition, (start, end) in window.items():
                read += end - start
                ends[partition] = start
                streams[partition].extend(sorted(fetched[partition], key=_offset, reverse=True))
            if everything:
                continue
            unread = {partition for partition, end in ends.items() if end > marks[partition][0]}
            ordered = _newest_first(streams, unread, wanted)
            if ordered is not None:
                break
            step *= 4
        if ordered is None:  # the whole topic was read: nothing is left unread to wait for
            ordered = _newest_first(streams, set(), None if everything else wanted) or []
        found = [letter for stream in streams.values() for _, _, letter in stream
                 if letter is not None]
        return View(ordered[wanted - PAGE_SIZE:wanted], len(found), groups_of(found), read, size)

    def one(self, dlt: str, partition: int, offset: int) -> DeadLetterRecord:
        return Reader(self.connection, dlt, self.timeout_s).one(partition, offset)

    # --- replaying -----------------------------------------------------------------------------

    def check_token(self, given: str | None) -> None:
        if self.token is None:
            raise HTTPException(403, "this console is read-only: start it with --token-file "
                                     "(or REDRIVE_UI_TOKEN, or --token) to replay")
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HTTPException(401, "a replay needs the console's token")

    def replay(self, request: ReplayRequest) -> ReplayReport:
        coordinates = frozenset(parse_coordinates(value) for value in request.records)
        to_topic = None
        if request.to == TO_RETRY:
            to_topic = self._first_retry_topic(request.dlt)
        elif request.to != TO_ORIGINAL:
            raise InvalidArgument("to", request.to, f"expected {TO_ORIGINAL!r} or {TO_RETRY!r}")
        if coordinates and request.selection.empty:
            # Named records only: replay reads just their offsets, not the whole topic, and
            # checks they are records (once: each read of 10,000 took a fifth of a replay).
            selection = DeadLetterFilter(coordinates=coordinates)
        else:
            if coordinates:
                Reader(self.connection, request.dlt, self.timeout_s).named(
                    DeadLetterFilter(coordinates=coordinates), "records")
            chosen = [(letter.record.partition, letter.record.offset)
                      for letter in self.letters(request.dlt, request.selection)]
            if coordinates:
                chosen = [place for place in chosen if place in coordinates]
            if not chosen:
                return ReplayReport(dry_run=request.dry_run)
            selection = DeadLetterFilter(coordinates=frozenset(chosen))
        return replay(self.connection, request.dlt, to=request.to, to_topic=to_topic,
                      selection=selection, dry_run=request.dry_run, rate=request.rate,
                      again=request.again, actor="redrive ui", timeout_s=self.timeout_s,
                      named_as="records")

    def _first_retry_topic(self, dlt: str) -> str:
        existing = kafka.topic_partitions(kafka.admin(self.connection), self.timeout_s)
        owner = topics.dead_letter_owner(dlt, existing)
        if owner is None:
            raise InvalidArgument("to", TO_RETRY, f"{dlt} is not named <topic>.<group>.dlt, so "
                                  "its group's retry topics are unknown: replay to 'original'")
        topic, group = owner
        found = discover_retry_topics(existing, topic, group)
        if not found:
            raise InvalidArgument("to", TO_RETRY, f"group {group} of {topic} has no retry topic "
                                  "on the cluster: replay to 'original'")
        return found[0]


# A record read: its timestamp, its offset and, when the filter selects it, the record.
_Read = tuple[int, int, "DeadLetterRecord | None"]


def _offset(read: _Read) -> int:
    return read[1]


def _newest_first(streams: dict[int, list[_Read]], unread: set[int],
                  wanted: int | None) -> list[DeadLetterRecord] | None:
    """The selected records, newest first: the partitions merged, each taken in its log order
    from its end back, the partition whose next record is newest going first. A record's
    timestamp is its producer's clock and may go back within a partition; in log order every
    page agrees with the others however far the topic was read. None when a partition with
    records left `unread` could come before the `wanted`-th (its next record is not read yet).
    """
    if any(not streams[partition] for partition in unread):
        return None
    heads = [(-stream[0][0], partition, -stream[0][1], 0)
             for partition, stream in streams.items() if stream]
    heapq.heapify(heads)
    ordered: list[DeadLetterRecord] = []
    while heads:
        _, partition, _, index = heapq.heappop(heads)
        stream = streams[partition]
        letter = stream[index][2]
        if letter is not None:
            ordered.append(letter)
            if wanted is not None and len(ordered) >= wanted:
                return ordered
        if index + 1 < len(stream):
            timestamp, offset, _ = stream[index + 1]
            heapq.heappush(heads, (-timestamp, partition, -offset, index + 1))
        elif partition in unread:
            return None
    return ordered


def _contains(letter: DeadLetterRecord, needle: str | None) -> bool:
    if not needle:
        return True
    record = letter.record
    return (needle in (text(record.key) or "") or needle in (text(record.value) or "")
            or any(needle in name or needle in (text(value) or "")
                   for name, value in record.headers))


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a user's typo is answered with a 400, not logged by RE2


def _pattern(field_name: str, expression: str | None) -> re2._Regexp[str] | None:
    if not expression:
        return None
    try:
        return re2.compile(expression, _RE2_OPTIONS)
    except UnicodeEncodeError as exc:  # a lone surrogate, which JSON can carry: no UTF-8 form
        raise InvalidArgument(field_name, expression, f"not a regular expression: {exc}") from exc
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(
            exc.args[0], bytes) else str(exc)
        raise InvalidArgument(field_name, expression, f"not a regular expression (RE2 syntax: "
                              f"no backreferences, lookaround or \\Z): {why}") from exc


def _message_matches(letter: DeadLetterRecord, pattern: re2._Regexp[str]) -> bool:
    # A record with no error message (no known header set, or malformed headers) has nothing
    # to search, so even `.*` leaves it out rather than treating the message as empty.
    message = letter.error_message
    if message is None:
        return False
    # RE2 reads UTF-8, which a lone surrogate a header decoded to has no form in.
    searchable = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return pattern.search(searchable) is not None


def _fingerprint_of(letter: DeadLetterRecord) -> str:
    return fingerprint(letter.error_type, letter.error_message)


def groups_of(letters: list[DeadLetterRecord]) -> list[Group]:
    """The letters grouped by fingerprint, largest group first."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for letter in letters:
        key = _fingerprint_of(letter)
        counts[key] += 1
        at = letter.record.timestamp_ms
        first[key] = min(first.get(key, at), at)
        last[key] = max(last.get(key, at), at)
    return [Group(key, count, first[key], last[key]) for key, count in counts.most_common()]


def value_view(raw: bytes | None) -> tuple[str, str]:
    """How a record's value is shown: ('json', pretty text), ('text', text) or ('hex', hex)."""
    if raw is None:
        return "text", ""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "hex", raw.hex(" ")
    try:
        pretty = json.dumps(json.loads(decoded), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # nested deeper than the parser goes: shown as text
        return "text", decoded
    try:
        pretty.encode("utf-8")
    except UnicodeEncodeError:
        # A string holding a lone surrogate ("\ud800") has no UTF-8 form: kept escaped.
        pretty = json.dumps(json.loads(decoded), indent=2)
    return "json", pretty


def report_json(report: ReplayReport) -> dict[str, Any]:
    return {"dry_run": report.dry_run, "replay_id": report.replay_id,
            "selected": report.selected,
            "planned": [{"source": list(source), "to": to} for source, to in report.planned],
            "replayed": [{"source": list(r.source), "destination": list(r.destination)}
                         for r in report.replayed],
            "already_replayed": [list(source) for source in report.already],
            "skipped": [{"source": list(s.source), "why": s.why} for s in report.skipped]}
