"""Notifications of dead records against a real store (SQLite and PostgreSQL): a row whose hook
always fails, a receiver that is down, the time a pass may take, claims that ran out and were
taken over; and a webhook answered with a redirect, a byte at a time, or not in HTTP (local
servers)."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from redrive.clock import now_ms
from redrive.errors import InvalidArgument
from redrive.metrics import Metrics
from redrive.store import RetryStore, Scheduler, claims, webhook
from redrive.store.notify import DOWN_AFTER, Notifier
from redrive.store.rows import StoredRetry
from redrive.store.schema import DEAD, retries
from redrive.store.webhook import Webhook, WebhookFailed

from .conftest import entry

CLAIM_MS = 60_000
CLAIM_S = CLAIM_MS / 1000


def dead_rows(store: RetryStore, group: str, count: int) -> None:
    store.write([entry(group, "t", o, status=DEAD, reason="exhausted") for o in range(count)], [])


def notified_marks(store: RetryStore) -> dict[int, int | None]:
    with store.engine.connect() as conn:
        return dict(conn.execute(select(retries.c.offset, retries.c.notified_ms)).all())


def test_a_row_whose_hook_always_fails_holds_back_no_other_and_is_given_up(
        store: RetryStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="redrive.store.notify")
    dead_rows(store, "rejected", 5)
    calls: list[int] = []

    def hook(row: StoredRetry) -> None:
        calls.append(row.offset)
        if row.offset == 0:
            raise RuntimeError("the receiver answers 400 for this one")

    metrics = Metrics("scheduler", "store")
    notifier = Notifier([hook], retry_after_s=0, tries=3, metrics=metrics)
    assert notifier.deliver(store, CLAIM_S) == 4
    # A new death each pass, notified before the failing row is tried again: the receiver
    # works, so the row's failures count against it.
    for offset in (5, 6):
        store.write([entry("rejected", "t", offset, status=DEAD, reason="exhausted")], [])
        assert notifier.deliver(store, CLAIM_S) == 1
    assert calls == [0, 1, 2, 3, 4, 5, 0, 6, 0]
    [given_up] = [r for r in caplog.records if r.levelno == logging.ERROR]
    [first] = [row.id for row in store.find() if row.offset == 0]
    assert given_up.getMessage() == (
        f"giving up on notifying dead record {first}: {hook!r} failed 3 times while other "
        "records were notified, the last time with RuntimeError: the receiver answers 400 for "
        "this one; marked notified")
    assert metrics.value("redrive_notifications_given_up_total") == 1
    assert notifier.deliver(store, CLAIM_S) == 0
    assert len(calls) == 9
    assert all(mark is not None and mark > 0 for mark in notified_marks(store).values())


def test_a_receiver_down_is_called_a_few_times_a_pass_and_no_row_is_given_up(
        store: RetryStore, caplog: pytest.LogCaptureFixture) -> None:
    dead_rows(store, "down", 5)
    down, calls = [True], list[int]()

    def hook(row: StoredRetry) -> None:
        calls.append(row.offset)
        if down[0]:
            raise ConnectionRefusedError("connection refused")

    # Long enough that the second pass comes within it on a loaded machine (CI's once did not
    # at 0.05 s, on PostgreSQL).
    notifier = Notifier([hook], retry_after_s=0.5, tries=2)
    assert notifier.deliver(store, CLAIM_S) == 0
    assert calls == [0, 1, 2][:DOWN_AFTER]
    assert notifier.deliver(store, CLAIM_S) == 0  # waits retry_after_s
    assert len(calls) == DOWN_AFTER
    for _ in range(4):
        time.sleep(0.6)
        assert notifier.deliver(store, CLAIM_S) == 0
    assert len(calls) == 5 * DOWN_AFTER  # every row failed more than `tries` times
    assert set(notified_marks(store).values()) == {None}

    down[0] = False
    time.sleep(0.6)
    assert notifier.deliver(store, CLAIM_S) == 5
    assert "giving up" not in caplog.text


def test_a_pass_hands_back_what_it_did_not_reach_in_half_the_claim(store: RetryStore) -> None:
    dead_rows(store, "slow", 5)
    notifier = Notifier([lambda row: time.sleep(0.25)])
    started = time.monotonic()
    done = notifier.deliver(store, 1.0)
    # Rows are started until 0.5 s have passed: the first two, or on a slow machine one.
    assert done in (1, 2) and time.monotonic() - started < 1.0
    marks = notified_marks(store).values()
    assert sum(mark is None for mark in marks) == 5 - done  # not claimed: the next pass's
    while done < 5:
        done += notifier.deliver(store, 1.0)
    assert all(mark is not None and mark > 0 for mark in notified_marks(store).values())


def test_a_stalled_notifier_leaves_the_claim_that_took_over_its_rows(store: RetryStore) -> None:
    dead_rows(store, "stalled", 3)
    at = now_ms()
    with store.engine.begin() as conn:
        stalled = claims.take_unnotified(conn, 10, at)
    # Its first hook hangs past the claim: another scheduler hands the claim back and claims the
    # rows again.
    assert store.release_notification_claims(CLAIM_MS, at_ms=at + CLAIM_MS + 1) == 3
    with store.engine.begin() as conn:
        taker = claims.take_unnotified(conn, 10, at + CLAIM_MS + 1)
    assert [row.offset for row in taker.rows] == [0, 1, 2]

    # The stalled one wakes up: one row notified, the others to hand back. Neither may touch
    # the live claim, or a third scheduler would notify the rows while the taker does.
    stalled.notified(stalled.rows[0].id)
    with store.engine.begin() as conn:
        claims.mark_notified(conn, stalled, at + CLAIM_MS + 2)
    assert set(notified_marks(store).values()) == {-(at + CLAIM_MS + 1)}
    with store.engine.begin() as conn:
        assert claims.take_unnotified(conn, 10, at + CLAIM_MS + 3).rows == []

    for row in taker.rows:
        taker.notified(row.id)
    with store.engine.begin() as conn:
        claims.mark_notified(conn, taker, at + CLAIM_MS + 4)
    assert set(notified_marks(store).values()) == {at + CLAIM_MS + 4}


@pytest.fixture
def redirecting() -> Iterator[tuple[str, list[str]]]:
    """A server that answers a POST to /<status> with that status and Location /moved, and
    anything to /moved with 200; the requests it saw, as method and path."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/moved":
                self.send_response(200)
            else:
                self.send_response(int(self.path.strip("/")))
                self.send_header("Location", "/moved")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = answer

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_webhook_redirect_is_a_failure_not_followed(
        tmp_path: Path, redirecting: tuple[str, list[str]], status: int) -> None:
    base, seen = redirecting
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "redirect", 1)
        [row] = store.find()
    # Followed, a 301/302/303 became a GET with no body whose 200 counted as notified.
    with pytest.raises(WebhookFailed, match=rf"HTTP {status}, a redirect to '/moved', not fol"):
        Webhook(f"{base}/{status}")(row)
    assert seen == [f"POST /{status}"]


@pytest.fixture
def raw_receiver() -> Iterator[tuple[str, list[bytes]]]:
    """A server that reads a request and answers it with the bytes the test puts in the list
    (one a tenth of a second apart if there are several), then closes; its URL."""
    answer: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    for index, piece in enumerate(answer):
                        if index and stop.wait(0.1):
                            break
                        conn.sendall(piece)
                except OSError:
                    pass  # the client hung up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/", answer
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def test_a_webhook_call_answered_a_byte_at_a_time_ends_at_its_timeout(
        tmp_path: Path, raw_receiver: tuple[str, list[bytes]]) -> None:
    """A socket timeout bounds each read: before, this call took the 10 s the answer took and
    counted as notified, holding the scheduler's pass (and its due retries) meanwhile."""
    url, answer = raw_receiver
    # The status line at once: the socket shut down in the headers reads as their end, which
    # had the call pass for a 200 at its deadline.
    rest = b"X-Slow: " + b"x" * 80 + b"\r\nContent-Length: 0\r\n\r\n"
    answer.extend([b"HTTP/1.1 200 OK\r\n", *(rest[i:i + 1] for i in range(len(rest)))])
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "drip", 1)
        [row] = store.find()
    started = time.monotonic()
    with pytest.raises(WebhookFailed, match=r"no whole answer within 1s") as failed:
        Webhook(url, timeout_s=1)(row)
    assert 1 <= time.monotonic() - started < 2.5
    assert failed.value.transient  # says nothing against the row


@pytest.mark.parametrize("timer_late", [False, True])
def test_a_webhook_call_to_a_name_of_unanswering_addresses_ends_at_its_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timer_late: bool) -> None:
    """Each of a name's addresses had the whole timeout, one after the other: three that never
    answer took this call 3 s of its 1 s. The connects' own timeouts end the call at its
    deadline, and it says so even where the deadline's timer thread has not run yet (on a busy
    machine the error read `URLError: <urlopen error timed out>`)."""
    if timer_late:
        late = threading.Timer
        monkeypatch.setattr(webhook.threading, "Timer",
                            lambda _seconds, function: late(3600, function))
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    # One connection fills the queue of a listener that never accepts: the next SYNs go
    # unanswered.
    filler = socket.create_connection(("127.0.0.1", port), timeout=5)
    silent = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [silent] * 3)
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "silent", 1)
        [row] = store.find()
    started = time.monotonic()
    try:
        with pytest.raises(WebhookFailed, match=r"no whole answer within 1s") as failed:
            Webhook(f"http://receiver.example:{port}/", timeout_s=1)(row)
    finally:
        filler.close()
        listener.close()
    assert time.monotonic() - started < 2
    assert failed.value.transient


def test_a_webhook_call_whose_name_lookup_hangs_ends_at_its_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup ran in the calling thread with the resolver's own timeouts: one that takes 5 s
    (a name server that does not answer) took this call 5 s of its 1 s."""
    def slow_lookup(*args: object, **kwargs: object) -> list[object]:
        time.sleep(5)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", slow_lookup)
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "lookup", 1)
        [row] = store.find()
    started = time.monotonic()
    with pytest.raises(WebhookFailed, match=r"no whole answer within 1s") as failed:
        Webhook("http://receiver.example:8080/", timeout_s=1)(row)
    assert 1 <= time.monotonic() - started < 2
    assert failed.value.transient


def test_a_webhook_call_to_a_name_that_does_not_resolve_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "noname", 1)
        [row] = store.find()
    with pytest.raises(WebhookFailed, match=r"Name or service not known") as failed:
        Webhook("http://receiver.example:8080/", timeout_s=1)(row)
    assert failed.value.transient


@pytest.mark.parametrize("url", ["http://[::1/", "http://a..b/", "http:///path",
                                 "https://host:port/"])
def test_a_webhook_url_no_call_could_use_is_refused_at_once(url: str) -> None:
    """Before, it was taken, and every call then failed with an error no caller converts."""
    with pytest.raises(InvalidArgument, match=r"not a URL that can be called"):
        Webhook(url)


def test_a_webhook_answer_that_is_not_http_is_a_transient_failure(
        tmp_path: Path, raw_receiver: tuple[str, list[bytes]]) -> None:
    """Before, http.client's own error escaped and counted as the receiver refusing the row,
    so a broken receiver got rows given up."""
    url, answer = raw_receiver
    answer.append(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    with RetryStore(tmp_path / "store.db") as store:
        dead_rows(store, "garbled", 1)
        [row] = store.find()
    with pytest.raises(WebhookFailed, match=r"BadStatusLine") as failed:
        Webhook(url, timeout_s=5)(row)
    assert failed.value.transient


def test_a_schedulers_webhook_call_ends_well_within_its_claim(tmp_path: Path) -> None:
    """A call that outlived the claim would let another scheduler take the row and notify it
    again."""
    with RetryStore(tmp_path / "store.db") as store:
        short = Scheduler(store, "127.0.0.1:1", webhook="http://127.0.0.1:1/", lease_s=8)
        default = Scheduler(store, "127.0.0.1:1", webhook="http://127.0.0.1:1/")
        timeouts = [hook.timeout_s for scheduler in (short, default)
                    for hook in scheduler.notifier.hooks if isinstance(hook, Webhook)]
    assert (short.claim_s, default.claim_s) == (8.0, 60.0)
    assert timeouts == [2.0, 10.0]


def test_a_receiver_that_fails_for_a_while_gets_no_row_given_up(store: RetryStore) -> None:
    """A 5xx, 408, 429 or an unreachable receiver says nothing against the row: before, such
    failures in passes where other rows went through gave rows up, marked notified unseen."""
    dead_rows(store, "flaky", 3)
    answers = iter(["ok", "503", "ok"] * 4)
    calls: list[int] = []

    def hook(row: StoredRetry) -> None:
        calls.append(row.offset)
        if next(answers) == "503":
            raise WebhookFailed("http://receiver", "HTTP 503", transient=True)

    notifier = Notifier([hook], retry_after_s=0, tries=1)
    assert notifier.deliver(store, CLAIM_S) == 2
    assert notifier.deliver(store, CLAIM_S) == 1  # tried again, not given up
    assert calls == [0, 1, 2, 1]
    assert all(mark is not None and mark > 0 for mark in notified_marks(store).values())


def test_rows_all_set_aside_are_not_claimed_again_before_they_are_due(
        store: RetryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    dead_rows(store, "aside", 3)
    claims: list[int] = []
    take = store.take_unnotified

    def counted(limit: int) -> Any:
        claims.append(limit)
        return take(limit)

    monkeypatch.setattr(store, "take_unnotified", counted)

    def hook(row: StoredRetry) -> None:
        if row.offset == 0:
            raise RuntimeError("refused")

    notifier = Notifier([hook], retry_after_s=60)
    assert notifier.deliver(store, CLAIM_S) == 2
    for _ in range(5):
        assert notifier.deliver(store, CLAIM_S) == 0
    # the set-aside row claimed once more, then left until it is due; before, each pass
    # claimed it and handed it back (two writes a pass)
    assert len(claims) == 2
    assert notified_marks(store)[0] is None
