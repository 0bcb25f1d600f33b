"""The operations console (`redrive ui`): one web page over the dead-letter, replay and stats
tools of this room, for the on-call engineer who wants to see what fails and replay it.

Server-rendered pages (Jinja2, which escapes everything read from Kafka) and a JSON API beside
them, documented by FastAPI at /docs. Reading needs nothing; a replay needs the token the server
was started with, typed into the form or sent as `Authorization: Bearer <token>`: a server
started without one is read-only. The token is never kept in a cookie, so a page of another site
cannot make a browser replay anything (and a form post from another origin is refused as well).
"""

from __future__ import annotations

import hmac
import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from confluent_kafka import KafkaException
from fastapi import FastAPI, Form, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from redrive import kafka, topics
from redrive.clock import now_ms
from redrive.errors import InvalidArgument, RedriveError, UnknownTopic
from redrive.ops import stats
from redrive.ops.deadletters import (
    DeadLetterFilter,
    DeadLetterRecord,
    Reader,
    make_filter,
    parse_coordinates,
    text,
)
from redrive.ops.replay import TO_ORIGINAL, TO_RETRY, ReplayReport, log_key, read_log, replay
from redrive.ops.stats import discover_retry_topics
from redrive.store import RetryStore
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD, PENDING, STATUSES

PAGE_SIZE = 50
# Records per partition read first when a page is asked for; each further step reads four times
# as many, further back.
FIRST_STEP = 500
_DLT_SUFFIX = f"{topics.SEPARATOR}dlt"
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))
# Numbers, hex ids and UUIDs vary between failures of one cause: a fingerprint leaves them out.
_VARYING = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}\b|\b0x[0-9a-fA-F]+\b|\d+")



def _ms_time(ms: int | None) -> str:
    if ms is None or ms < 0:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _query(filters: dict[str, str], **changes: Any) -> str:
    return urlencode({k: v for k, v in {**filters, **changes}.items() if v})


def _age(ms: int) -> str:
    """5s, 1m 5s, 1h 1m, 1d 1h: the two largest units."""
    seconds = max(0, ms) // 1000
    units = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
    for index, (name, size) in enumerate(units[:-1]):
        if seconds >= size:
            smaller, small_size = units[index + 1]
            return f"{seconds // size}{name} {seconds % size // small_size}{smaller}"
    return f"{seconds}s"


TEMPLATES.env.filters.update(ms_time=_ms_time, as_text=text, query=_query, age=_age)

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
    (and no unread record can be newer than the page's last), unless `everything` was asked: so
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
    since: str | None = Field(default=None, description="A duration (2h) or an ISO time.")
    to: str = Field(default=TO_ORIGINAL, description="'original' or 'retry' (the group's "
                    "first retry topic).")
    dry_run: bool = True
    rate: str | None = Field(default=None, description="Records per second, e.g. 50/s.")


class Console:
    """What the pages and the API read and do, over one cluster."""

    def __init__(self, connection: kafka.Connection, *, token: str | None,
                 store: RetryStore | None = None, timeout_s: float = 10.0) -> None:
        self.connection = connection
        self.token = token or None
        self.store = store
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
                stem = name[:-len(_DLT_SUFFIX)]
                topic, _, group = stem.rpartition(topics.SEPARATOR)
                found.append(DeadLetterTopic(name, topic or None, group if topic else None, size))
            return found
        finally:
            consumer.close()

    def health(self, found: DeadLetterTopic) -> GroupHealth:
        """The figures of `redrive stats` for the group a dead-letter topic belongs to."""
        if found.topic is None or found.group is None:
            return GroupHealth("", "", found.name, None, 0, 0, None, None, found.records,
                               "not named <topic>.<group>.dlt")
        try:
            rows = stats.collect(self.connection, found.topic, found.group,
                                 timeout_s=self.timeout_s)
        except (KafkaException, RedriveError) as exc:
            return GroupHealth(found.topic, found.group, found.name, None, 0, 0, None, None,
                               found.records, str(exc))
        main = [row for row in rows if row.role == stats.MAIN]
        retries = [row for row in rows if row.role == stats.RETRY]
        oldest = [row.oldest_ms for row in retries if row.oldest_ms is not None]
        dues = [row.next_due_ms for row in retries if row.next_due_ms is not None]
        return GroupHealth(found.topic, found.group, found.name,
                           main[0].lag if main else None, sum(r.waiting for r in retries),
                           len(retries), min(oldest, default=None), min(dues, default=None),
                           found.records)

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
        entries = list(read_log(self.connection, dlt, self.timeout_s).values())
        return sorted(entries, key=lambda entry: entry.get("when_ms", 0), reverse=True)

    def letters(self, dlt: str, *, reason: str | None = None, error_type: str | None = None,
                since: str | None = None, contains: str | None = None,
                fingerprint_is: str | None = None) -> list[DeadLetterRecord]:
        """The records of `dlt` the filter selects, newest first."""
        selection = make_filter(reasons=[reason] if reason else [],
                                error_types=[error_type] if error_type else [], since=since)
        found = [letter for letter in Reader(self.connection, dlt, self.timeout_s)
                 .records(selection)
                 if _contains(letter, contains)
                 and (not fingerprint_is or _fingerprint_of(letter) == fingerprint_is)]
        found.sort(key=lambda letter: (letter.record.timestamp_ms, letter.record.offset),
                   reverse=True)
        return found

    def view(self, dlt: str, *, page: int = 1, everything: bool = False,
             reason: str | None = None, error_type: str | None = None,
             since: str | None = None, contains: str | None = None,
             fingerprint_is: str | None = None) -> View:
        selection = make_filter(reasons=[reason] if reason else [],
                                error_types=[error_type] if error_type else [], since=since)
        reader = Reader(self.connection, dlt, self.timeout_s)
        marks = reader.marks()
        size = sum(high - low for low, high in marks.values())
        wanted = page * PAGE_SIZE
        ends = {partition: high for partition, (_, high) in marks.items()}
        step = max(FIRST_STEP, wanted)
        found: list[DeadLetterRecord] = []
        boundary: dict[int, int] = {}  # partition -> timestamp of its oldest record read
        read = 0
        while True:
            window = {partition: (max(marks[partition][0], end - step), end)
                      for partition, end in ends.items() if end > marks[partition][0]}
            if not window:
                break
            oldest: dict[int, tuple[int, int]] = {}  # partition -> (offset, timestamp)
            for letter in reader.ranges(window):
                record = letter.record
                seen = oldest.get(record.partition)
                if seen is None or record.offset < seen[0]:
                    oldest[record.partition] = (record.offset, record.timestamp_ms)
                if selection.matches(letter) and _contains(letter, contains) and (
                        not fingerprint_is or _fingerprint_of(letter) == fingerprint_is):
                    found.append(letter)
            for partition, (start, end) in window.items():
                read += end - start
                ends[partition] = start
                if partition in oldest:
                    # Nothing unread of the partition is newer than its oldest record read.
                    boundary[partition] = oldest[partition][1]
            if everything:
                continue
            found.sort(key=_newest_first)
            if len(found) >= wanted:
                last = found[wanted - 1].record.timestamp_ms
                if all(partition in boundary and boundary[partition] <= last
                       for partition, end in ends.items() if end > marks[partition][0]):
                    break
            step *= 4
        found.sort(key=_newest_first)
        start = wanted - PAGE_SIZE
        return View(found[start:wanted], len(found), groups_of(found), read, size)

    def one(self, dlt: str, partition: int, offset: int) -> DeadLetterRecord:
        return Reader(self.connection, dlt, self.timeout_s).one(partition, offset)

    # --- replaying -----------------------------------------------------------------------------

    def check_token(self, given: str | None) -> None:
        if self.token is None:
            raise HTTPException(403, "this console is read-only: start it with --token "
                                     "(or REDRIVE_UI_TOKEN) to replay")
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HTTPException(401, "a replay needs the console's token")

    def replay(self, request: ReplayRequest) -> ReplayReport:
        coordinates = frozenset(parse_coordinates(value) for value in request.records)
        to_topic = None
        if request.to == TO_RETRY:
            to_topic = self._first_retry_topic(request.dlt)
        elif request.to != TO_ORIGINAL:
            raise InvalidArgument("to", request.to, f"expected {TO_ORIGINAL!r} or {TO_RETRY!r}")
        if coordinates and not (request.reason or request.error_type or request.since
                                or request.fingerprint or request.contains):
            # Named records only: replay reads just their offsets, not the whole topic.
            selection = DeadLetterFilter(coordinates=coordinates)
        else:
            chosen = [(letter.record.partition, letter.record.offset) for letter in self.letters(
                request.dlt, reason=request.reason, error_type=request.error_type,
                since=request.since, contains=request.contains,
                fingerprint_is=request.fingerprint)]
            if coordinates:
                chosen = [place for place in chosen if place in coordinates]
            if not chosen:
                return ReplayReport(dry_run=request.dry_run)
            selection = DeadLetterFilter(coordinates=frozenset(chosen))
        return replay(self.connection, request.dlt, to=request.to, to_topic=to_topic,
                      selection=selection, dry_run=request.dry_run, rate=request.rate,
                      actor="redrive ui", timeout_s=self.timeout_s)

    def _first_retry_topic(self, dlt: str) -> str:
        stem = dlt[:-len(_DLT_SUFFIX)] if dlt.endswith(_DLT_SUFFIX) else ""
        topic, _, group = stem.rpartition(topics.SEPARATOR)
        if not topic:
            raise InvalidArgument("to", TO_RETRY, f"{dlt} is not named <topic>.<group>.dlt, so "
                                  "its group's retry topics are unknown: replay to 'original'")
        existing = kafka.topic_partitions(kafka.admin(self.connection), self.timeout_s)
        found = discover_retry_topics(existing, topic, group)
        if not found:
            raise InvalidArgument("to", TO_RETRY, f"group {group} of {topic} has no retry topic "
                                  "on the cluster: replay to 'original'")
        return found[0]


def _newest_first(letter: DeadLetterRecord) -> tuple[int, int, int]:
    record = letter.record
    return (-record.timestamp_ms, record.partition, -record.offset)


def _contains(letter: DeadLetterRecord, needle: str | None) -> bool:
    if not needle:
        return True
    record = letter.record
    return (needle in (text(record.key) or "") or needle in (text(record.value) or "")
            or any(needle in name or needle in (text(value) or "")
                   for name, value in record.headers))


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
        return "json", json.dumps(json.loads(decoded), indent=2, ensure_ascii=False)
    except ValueError:
        return "text", decoded


def report_json(report: ReplayReport) -> dict[str, Any]:
    return {"dry_run": report.dry_run, "selected": report.selected,
            "planned": [{"source": list(source), "to": to} for source, to in report.planned],
            "replayed": [{"source": list(r.source), "destination": list(r.destination)}
                         for r in report.replayed],
            "already_replayed": [list(source) for source in report.already],
            "skipped": [{"source": list(s.source), "why": s.why} for s in report.skipped]}


def create_app(connection: kafka.Connection, *, token: str | None = None,
               store: RetryStore | None = None, timeout_s: float = 10.0) -> FastAPI:
    """The console's web app; serve it with uvicorn (`redrive ui` does). With `store`, it also
    shows the retry store's rows and can requeue or cancel them."""
    console = Console(connection, token=token, store=store, timeout_s=timeout_s)
    app = FastAPI(title="redrive console", version="1",
                  description="Dead letters of a Kafka cluster, and their replay.")

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(request, name, {"writable": console.token is not None,
                                                          "with_store": console.store is not None,
                                                          **context}, status_code=status)

    def problem(request: Request, error: Exception, status: int) -> HTMLResponse:
        return page(request, "problem.html", status, message=str(error))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def overview(request: Request) -> HTMLResponse:
        try:
            found = console.dead_letter_topics()
        except (KafkaException, RedriveError) as exc:
            return page(request, "overview.html", 503, groups=[], down=str(exc))
        return page(request, "overview.html", groups=[console.health(t) for t in found],
                    down=None, now=now_ms())

    @app.get("/api/groups")
    def api_groups() -> list[dict[str, Any]]:
        """Per group with a dead-letter topic: its main topic's lag, the records waiting in
        its retry topics (the oldest, the next due), and its dead letters."""
        try:
            return [vars(console.health(found)) for found in console.dead_letter_topics()]
        except (KafkaException, RedriveError) as exc:
            raise HTTPException(503, f"the cluster cannot be read: {exc}") from exc

    @app.get("/replays", response_class=HTMLResponse, include_in_schema=False)
    def replays_page(request: Request, dlt: str = "") -> HTMLResponse:
        try:
            entries = console.replays(dlt or None)
        except (KafkaException, RedriveError) as exc:
            return problem(request, exc, 503)
        return page(request, "replays.html", entries=entries, dlt=dlt)

    @app.get("/api/replays")
    def api_replays(dlt: str | None = None) -> list[dict[str, Any]]:
        """The replay log (who replayed which record where, and when), newest first."""
        try:
            return console.replays(dlt)
        except (KafkaException, RedriveError) as exc:
            raise HTTPException(503, str(exc)) from exc

    @app.get("/store", response_class=HTMLResponse, include_in_schema=False)
    def store_page(request: Request) -> HTMLResponse:
        try:
            rows = console.store_rows()
        except InvalidArgument as exc:
            return problem(request, exc, 404)
        except RedriveError as exc:
            return problem(request, exc, 503)
        return page(request, "store.html", rows=rows)

    @app.post("/store/{action}", response_class=HTMLResponse, include_in_schema=False)
    def store_form(request: Request, action: str, group: Annotated[str, Form()],
                   status: Annotated[str, Form()], topic: Annotated[str, Form()] = "",
                   token: Annotated[str, Form()] = "",
                   origin: Annotated[str | None, Header()] = None) -> HTMLResponse:
        if origin is not None and origin.rstrip("/") != str(request.base_url).rstrip("/"):
            return problem(request, PermissionError(f"a form from {origin} is refused"), 403)
        try:
            console.check_token(token)
        except HTTPException as exc:
            return problem(request, PermissionError(exc.detail), exc.status_code)
        try:
            done = console.store_act(action, StoreAction(group=group, topic=topic or None,
                                                         status=status))
        except RedriveError as exc:
            return problem(request, exc, 400)
        return page(request, "store.html", rows=console.store_rows(),
                    done=f"{action}: {done} row(s) of {group}")

    @app.get("/api/store")
    def api_store() -> list[dict[str, Any]]:
        """The retry store's rows per group and topic, by status (with --store-url)."""
        try:
            return console.store_rows()
        except InvalidArgument as exc:
            raise HTTPException(404, str(exc)) from exc

    @app.post("/api/store/{action}")
    def api_store_act(action: str, wanted: StoreAction,
                      authorization: Annotated[str | None, Header()] = None) -> dict[str, int]:
        """`requeue` a group's dead rows or `cancel` its pending ones. Needs the token."""
        given = authorization[7:] if authorization and authorization.startswith("Bearer ") \
            else None
        console.check_token(given)
        try:
            return {"rows": console.store_act(action, wanted)}
        except RedriveError as exc:
            raise HTTPException(400, str(exc)) from exc

    @app.get("/api/dead-letter-topics")
    def api_topics() -> list[dict[str, Any]]:
        """Every dead-letter topic on the cluster, with its main topic, group and size."""
        try:
            return [vars(found) for found in console.dead_letter_topics()]
        except (KafkaException, RedriveError) as exc:
            raise HTTPException(503, f"the cluster cannot be read: {exc}") from exc

    @app.get("/dead-letters/{dlt}", response_class=HTMLResponse, include_in_schema=False)
    def dead_letters(request: Request, dlt: str, reason: str = "", error_type: str = "",
                     since: str = "", q: str = "", fp: str = "", everything: str = "",
                     page_number: Annotated[int, Query(alias="page", ge=1)] = 1
                     ) -> HTMLResponse:
        filters = {"reason": reason, "error_type": error_type, "since": since, "q": q, "fp": fp,
                   "everything": everything}
        try:
            shown = console.view(dlt, page=page_number, everything=bool(everything),
                                 reason=reason or None, error_type=error_type or None,
                                 since=since or None, contains=q or None,
                                 fingerprint_is=fp or None)
        except UnknownTopic as exc:
            return problem(request, exc, 404)
        except InvalidArgument as exc:
            return problem(request, exc, 400)
        return page(request, "dead_letters.html", dlt=dlt, filters=filters, view=shown,
                    page=page_number, page_size=PAGE_SIZE, now=now_ms())

    @app.get("/api/dead-letters/{dlt}")
    def api_dead_letters(dlt: str, reason: str | None = None, error_type: str | None = None,
                         since: str | None = None, q: str | None = None,
                         fingerprint_is: Annotated[str | None, Query(alias="fp")] = None,
                         everything: bool = False,
                         page_number: Annotated[int, Query(alias="page", ge=1)] = 1
                         ) -> dict[str, Any]:
        """A page of the records the filter selects, newest first, and their groups by cause.
        The topic is read from its end only as far as the page needs (`complete`: the whole
        topic was read; `matched` and `groups` count what was read), all of it with
        everything=true."""
        try:
            shown = console.view(dlt, page=page_number, everything=everything, reason=reason,
                                 error_type=error_type, since=since, contains=q,
                                 fingerprint_is=fingerprint_is)
        except UnknownTopic as exc:
            raise HTTPException(404, str(exc)) from exc
        except InvalidArgument as exc:
            raise HTTPException(400, str(exc)) from exc
        at = now_ms()
        return {"matched": shown.matched, "complete": shown.complete, "read": shown.read,
                "size": shown.size, "page": page_number,
                "records": [letter.to_json(at) for letter in shown.letters],
                "groups": [vars(group) for group in shown.groups]}

    @app.get("/dead-letters/{dlt}/{partition}/{offset}", response_class=HTMLResponse,
             include_in_schema=False)
    def record(request: Request, dlt: str, partition: int, offset: int) -> HTMLResponse:
        try:
            letter = console.one(dlt, partition, offset)
        except UnknownTopic as exc:
            return problem(request, exc, 404)
        except InvalidArgument as exc:
            return problem(request, exc, 404)
        kind, shown = value_view(letter.record.value)
        replayed = read_log(console.connection, dlt, console.timeout_s).get(
            log_key(dlt, partition, offset))
        return page(request, "record.html", dlt=dlt, letter=letter, replayed=replayed,
                    details=letter.to_json(now_ms(), full=True), value_kind=kind, value=shown)

    @app.post("/dead-letters/{dlt}/replay", response_class=HTMLResponse,
              include_in_schema=False)
    def replay_form(request: Request, dlt: str, token: Annotated[str, Form()] = "",
                    records: Annotated[str, Form()] = "", reason: Annotated[str, Form()] = "",
                    error_type: Annotated[str, Form()] = "", since: Annotated[str, Form()] = "",
                    fp: Annotated[str, Form()] = "", q: Annotated[str, Form()] = "",
                    to: Annotated[str, Form()] = TO_ORIGINAL,
                    dry_run: Annotated[str, Form()] = "", rate: Annotated[str, Form()] = "",
                    origin: Annotated[str | None, Header()] = None) -> HTMLResponse:
        if origin is not None and origin.rstrip("/") != str(request.base_url).rstrip("/"):
            return problem(request, PermissionError(f"a replay form from {origin} is refused"),
                           403)
        try:
            console.check_token(token)
        except HTTPException as exc:
            return problem(request, PermissionError(exc.detail), exc.status_code)
        wanted = ReplayRequest(dlt=dlt, records=records.split() if records else [],
                               reason=reason or None, error_type=error_type or None,
                               fingerprint=fp or None, contains=q or None,
                               since=since or None, to=to,
                               dry_run=bool(dry_run), rate=rate or None)
        try:
            report = console.replay(wanted)
        except UnknownTopic as exc:
            return problem(request, exc, 404)
        except RedriveError as exc:
            return problem(request, exc, 400)
        return page(request, "replayed.html", dlt=dlt, report=report, wanted=wanted)

    @app.post("/api/replay")
    def api_replay(wanted: ReplayRequest,
                   authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        """Replay a selection of a dead-letter topic (a dry run unless dry_run is false),
        through the same idempotent, audited replay log as `redrive dlt replay`. Needs
        `Authorization: Bearer <token>`."""
        given = authorization[7:] if authorization and authorization.startswith("Bearer ") \
            else None
        console.check_token(given)
        try:
            return report_json(console.replay(wanted))
        except UnknownTopic as exc:
            raise HTTPException(404, str(exc)) from exc
        except RedriveError as exc:
            raise HTTPException(400, str(exc)) from exc

    return app
