"""The operations console's web app (`redrive ui`): server-rendered pages and a JSON API over
`redrive.ops.console`, for the on-call engineer who wants to see what fails and replay it.

Pages are Jinja2 templates, which escape everything read from Kafka; the JSON API is documented
by FastAPI at /docs. Reading needs nothing; a replay or a store action needs the token the server
was started with, typed into the form or sent as `Authorization: Bearer <token>`: a server
started without one is read-only. The token is never kept in a cookie, so a page of another site
cannot make a browser act (and a form posted from another origin is refused as well). Served by
`redrive ui`, it answers only to the Host names it was told (a page of another site that
rebinds its own name to the console's address is refused), and no page of it can be framed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from confluent_kafka import KafkaException
from fastapi import FastAPI, Form, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.datastructures import URL
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from redrive import kafka
from redrive.clock import now_ms
from redrive.errors import BrokerUnavailable, InvalidArgument, RedriveError, UnknownTopic
from redrive.headers import MAX_TIME_MS
from redrive.ops.console import (
    MAX_PAGE,
    PAGE_SIZE,
    Console,
    ReplayRequest,
    Selection,
    StoreAction,
    report_json,
    value_view,
)
from redrive.ops.deadletters import text
from redrive.ops.replay import TO_ORIGINAL
from redrive.ops.waiting import DEFAULT_DELAY, DelayTiers
from redrive.store import RetryStore, StoreUnavailable

# The Host names a console on this machine is reached by, whatever else it is told.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))


def _ms_time(ms: int | None) -> str:
    if ms is None or ms < 0:
        return ""
    if ms > MAX_TIME_MS:  # a producer may stamp a record past what a datetime holds
        return f"{ms} ms"
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


def _rate(per_minute: float) -> str:
    """0.033, 0.5, 12.5: a low rate keeps two digits, so that one record an hour is not 0."""
    return f"{per_minute:.2g}" if 0 < per_minute < 1 else f"{per_minute:.1f}"


TEMPLATES.env.filters.update(ms_time=_ms_time, as_text=text, query=_query, age=_age,
                             rate=_rate)


def _cross_site(request: Request, origin: str | None) -> bool:
    """Whether a form was posted from a page of another origin (browsers send Origin)."""
    return origin is not None and origin.rstrip("/") != str(request.base_url).rstrip("/")


class _TrustedHosts(TrustedHostMiddleware):
    """Starlette's Host check, whose refusal says which names are served and how to add one."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allow_any:
            host = (URL(scope=scope).hostname or "").lower()
            if not any(host == pattern or (pattern.startswith("*.") and host.endswith(
                    pattern[1:])) for pattern in self.allowed_hosts):
                await PlainTextResponse(
                    f"Host {host!r} is not one this console answers to "
                    f"({', '.join(self.allowed_hosts)}): start it with --allowed-host {host} "
                    "if that name is yours", status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer(authorization: str | None) -> str | None:
    prefix = "Bearer "
    return authorization[len(prefix):] if authorization and authorization.startswith(prefix) \
        else None


def create_app(connection: kafka.Connection, *, token: str | None = None,
               store: RetryStore | None = None, delay: DelayTiers = DEFAULT_DELAY,
               timeout_s: float = 10.0, hosts: Sequence[str] | None = None) -> FastAPI:
    """The console's web app; serve it with uvicorn (`redrive ui` does). With `store`, it also
    shows the retry store's rows and can requeue or cancel them; `delay` names the delay
    service whose tiers hold the groups' retries (the defaults of `redrive delay run`).
    `hosts`: the Host names it answers to (`*.example.com` for a domain's); others get a 400.
    None answers to any, for an app served behind a proxy that checks them."""
    console = Console(connection, token=token, store=store, delay=delay, timeout_s=timeout_s)
    app = FastAPI(title="redrive console", version="1",
                  description="Dead letters of a Kafka cluster, and their replay.")
    if hosts is not None:
        app.add_middleware(_TrustedHosts, allowed_hosts=list(hosts), www_redirect=False)

    @app.middleware("http")
    async def no_framing(request: Request, call_next: Any) -> Response:
        # A page of another site could frame a form and trick a click on Replay.
        response: Response = await call_next(request)
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        return response

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(request, name, {"writable": console.token is not None,
                                                          "with_store": console.store is not None,
                                                          **context}, status_code=status)

    def problem(request: Request, error: Exception, status: int) -> HTMLResponse:
        return page(request, "problem.html", status, message=str(error))

    @app.exception_handler(RedriveError)
    @app.exception_handler(KafkaException)
    def cluster_down(request: Request, error: Exception) -> Response:
        # Any page or call that reads the cluster: 503 naming the brokers (or the read that
        # failed, or the replay refused), not a 500. Bad input not already answered: 400, 404.
        status = 400 if isinstance(error, InvalidArgument) else \
            404 if isinstance(error, UnknownTopic) else 503
        if request.url.path.startswith("/api/"):
            detail = f"{_source(error)} cannot be read: {error}" if status == 503 else str(error)
            return JSONResponse({"detail": detail}, status)
        return problem(request, error, status)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def overview(request: Request) -> HTMLResponse:
        try:
            groups = console.groups()
        except (KafkaException, RedriveError) as exc:
            return page(request, "overview.html", 503, groups=[], down=str(exc))
        return page(request, "overview.html", groups=groups, down=None, now=now_ms())

    @app.get("/api/groups")
    def api_groups() -> list[dict[str, Any]]:
        """Per group with a dead-letter topic: its main topic's lag, the records waiting in
        its retry topics (the oldest, the next due), and its dead letters; and (`activity`)
        the records written to its main, retry and dead-letter topics over the last hour and
        day, with per-minute rates over the hour, and the dead letters of each window by
        reason (`complete` false: only the newest were read, the counts are lower bounds);
        and (`elsewhere`) its retries waiting in the retry store (with --store-url) or in the
        delay service's tiers: how many, the oldest, the next due."""
        try:
            return [health.to_json() for health in console.groups()]
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
        if _cross_site(request, origin):
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
        console.check_token(_bearer(authorization))
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
                     since: str = "", until: str = "", q: str = "", fp: str = "",
                     message: str = "", everything: bool = False,
                     page_number: Annotated[int, Query(alias="page", ge=1, le=MAX_PAGE)] = 1
                     ) -> HTMLResponse:
        filters = {"reason": reason, "error_type": error_type, "since": since, "until": until,
                   "q": q, "fp": fp, "message": message, "everything": "1" if everything else ""}
        try:
            shown = console.view(dlt, Selection(reason=reason, error_type=error_type, since=since,
                                                until=until, contains=q, fingerprint=fp,
                                                message=message),
                                 page=page_number, everything=everything)
        except UnknownTopic as exc:
            return problem(request, exc, 404)
        except InvalidArgument as exc:
            return problem(request, exc, 400)
        return page(request, "dead_letters.html", dlt=dlt, filters=filters, view=shown,
                    page=page_number, page_size=PAGE_SIZE, max_page=MAX_PAGE,
                    now=now_ms())

    @app.get("/api/dead-letters/{dlt}")
    def api_dead_letters(dlt: str, reason: str | None = None, error_type: str | None = None,
                         since: str | None = None, until: str | None = None,
                         q: str | None = None,
                         fingerprint_is: Annotated[str | None, Query(alias="fp")] = None,
                         message: str | None = None, everything: bool = False,
                         page_number: Annotated[int, Query(alias="page", ge=1, le=MAX_PAGE)] = 1
                         ) -> dict[str, Any]:
        """A page of the records the filter selects, newest first, and their groups by cause.
        `since` and `until` bound the time a record was written: a duration back from now (2h)
        or an ISO time; `message` is a regular expression (RE2 syntax: no backreferences or
        lookaround) searched in the error message. The topic is read from its end only as far
        as the page needs (`complete`: the whole topic was read; `matched` and `groups` count
        what was read), all of it with everything=true; `page` goes up to 1000."""
        try:
            shown = console.view(dlt, Selection(reason=reason, error_type=error_type, since=since,
                                                until=until, contains=q,
                                                fingerprint=fingerprint_is, message=message),
                                 page=page_number, everything=everything)
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
        return page(request, "record.html", dlt=dlt, letter=letter,
                    replays=console.record_replays(letter),
                    details=letter.to_json(now_ms(), full=True), value_kind=kind, value=shown)

    @app.get("/api/dead-letters/{dlt}/{partition}/{offset}")
    def api_record(dlt: str, partition: int, offset: int) -> dict[str, Any]:
        """One record with every header decoded, its value and trace, and (`replays`) every
        replay of it the replay log keeps, newest first: when, by whom, to where and by which
        replay (`replay_id`)."""
        try:
            letter = console.one(dlt, partition, offset)
        except (UnknownTopic, InvalidArgument) as exc:
            raise HTTPException(404, str(exc)) from exc
        return {**letter.to_json(now_ms(), full=True),
                "replays": console.record_replays(letter)}

    @app.post("/dead-letters/{dlt}/replay", response_class=HTMLResponse,
              include_in_schema=False)
    def replay_form(request: Request, dlt: str, token: Annotated[str, Form()] = "",
                    records: Annotated[str, Form()] = "", reason: Annotated[str, Form()] = "",
                    error_type: Annotated[str, Form()] = "", since: Annotated[str, Form()] = "",
                    until: Annotated[str, Form()] = "", fp: Annotated[str, Form()] = "",
                    q: Annotated[str, Form()] = "", message: Annotated[str, Form()] = "",
                    to: Annotated[str, Form()] = TO_ORIGINAL,
                    dry_run: Annotated[str, Form()] = "", rate: Annotated[str, Form()] = "",
                    again: Annotated[str, Form()] = "",
                    origin: Annotated[str | None, Header()] = None) -> HTMLResponse:
        if _cross_site(request, origin):
            return problem(request, PermissionError(f"a form from {origin} is refused"), 403)
        try:
            console.check_token(token)
        except HTTPException as exc:
            return problem(request, PermissionError(exc.detail), exc.status_code)
        wanted = ReplayRequest(dlt=dlt, records=records.split() if records else [],
                               reason=reason or None, error_type=error_type or None,
                               fingerprint=fp or None, contains=q or None,
                               message=message or None,
                               since=since or None, until=until or None, to=to,
                               dry_run=bool(dry_run), rate=rate or None, again=bool(again))
        try:
            report = console.replay(wanted)
        except UnknownTopic as exc:
            return problem(request, exc, 404)
        except BrokerUnavailable:
            raise
        except RedriveError as exc:
            return problem(request, exc, 400)
        return page(request, "replayed.html", dlt=dlt, report=report, wanted=wanted)

    @app.post("/api/replay")
    def api_replay(wanted: ReplayRequest,
                   authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        """Replay a selection of a dead-letter topic (a dry run unless dry_run is false),
        through the same idempotent, audited replay log as `redrive dlt replay`. Needs
        `Authorization: Bearer <token>`."""
        console.check_token(_bearer(authorization))
        try:
            return report_json(console.replay(wanted))
        except UnknownTopic as exc:
            raise HTTPException(404, str(exc)) from exc
        except BrokerUnavailable:
            raise
        except RedriveError as exc:
            raise HTTPException(400, str(exc)) from exc

    return app


def _source(error: Exception) -> str:
    """What a read that failed was of, for the message that says so."""
    return "the retry store" if isinstance(error, StoreUnavailable) else "the cluster"
