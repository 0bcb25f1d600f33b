"""The webhook that receives each dead record as JSON, and the bound on how long one call takes.

A socket timeout bounds each read and write, not the call: a receiver sending its answer a byte
at a time could hold a call, and the scheduler's pass with it (due retries included), for as long
as it liked, and past its claim another scheduler notifies the row again. So a call has a
deadline: when it passes, the call's socket is shut down, which ends a read blocked on it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from redrive.errors import InvalidArgument, RedriveError
from redrive.store.rows import StoredRetry


class WebhookFailed(RedriveError):
    """transient: the receiver did not take any record just then (unreachable, timed out, 5xx,
    408, 429, an answer that is not HTTP), rather than refused this one."""

    def __init__(self, url: str, why: str, *, transient: bool = False) -> None:
        self.url = url
        self.transient = transient
        super().__init__(f"webhook {url}: {why}")


def describe(row: StoredRetry) -> dict[str, Any]:
    """What a notification says about a dead record (no value: it may be large or private)."""
    return {
        "id": row.id, "group": row.group, "topic": row.topic, "partition": row.partition,
        "offset": row.offset, "timestamp_ms": row.timestamp_ms,
        "key": None if row.key is None else base64.b64encode(row.key).decode(),
        "attempt": row.attempt, "reason": row.reason, "error_type": row.error_type,
        "error_message": row.error_message, "first_failure_ms": row.first_failure_ms,
        "died_ms": row.updated_ms, "mode": row.mode,
    }


class Webhook:
    """POST each dead record's description as JSON to `url`, the whole call within
    `timeout_s`; any non-2xx answer is a failure, a redirect too (not followed: point the
    webhook at where it leads)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidArgument("webhook", url, "must be an http:// or https:// URL")
        try:
            # What every call would otherwise fail on, outside the errors it converts.
            parts = urllib.parse.urlsplit(url)
            if not parts.hostname:
                raise ValueError("it names no host")
            parts.hostname.encode("idna")
            _ = parts.port
        except (ValueError, UnicodeError) as exc:
            raise InvalidArgument("webhook", url, f"not a URL that can be called: {exc}") from exc
        self.url = url
        self.timeout_s = timeout_s

    def __call__(self, row: StoredRetry) -> None:
        body = json.dumps(describe(row)).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with _Deadline(self.timeout_s) as deadline:
            opener = urllib.request.build_opener(_NoRedirects, _BoundedHandler(deadline))
            try:
                with opener.open(request, timeout=self.timeout_s) as response:
                    status = int(response.status)
                    # Before the response closes the socket, whose number another thread
                    # could be given again by the time a late cut used it.
                    deadline.release()
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:
                    raise WebhookFailed(self.url, f"HTTP {exc.code}, a redirect to "
                                        f"{exc.headers.get('Location')!r}, not followed") from exc
                raise WebhookFailed(self.url, f"HTTP {exc.code}",
                                    transient=exc.code >= 500 or exc.code in (408, 429)) from exc
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                why = (f"no whole answer within {self.timeout_s:g}s" if deadline.over
                       else f"{type(exc).__name__}: {exc}")
                raise WebhookFailed(self.url, why, transient=True) from exc
        if deadline.passed:
            # The socket shut down in the headers reads as their end (over TLS, before the
            # status line too): the answer seemed whole, but the receiver may not have meant it.
            raise WebhookFailed(self.url, f"no whole answer within {self.timeout_s:g}s",
                                transient=True)
        if not 200 <= status < 300:
            raise WebhookFailed(self.url, f"HTTP {status}")

    def __repr__(self) -> str:
        return f"Webhook({self.url!r})"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # Followed, a 301/302/303 turned the POST into a GET with no body, whose 2xx marked the
    # record notified though the receiver never saw it; a 307/308 failed anyway.
    def redirect_request(self, *args: Any) -> None:
        return None


class _Deadline:
    """Shuts down the socket a call holds once `seconds` have passed since it was entered."""

    def __init__(self, seconds: float) -> None:
        self.passed = False
        self._seconds = seconds
        self._ends = 0.0  # time.monotonic()
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._ends = time.monotonic() + self._seconds
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """The call is done with its socket: no cut touches it from now on."""
        self._timer.cancel()
        with self._lock:
            self._socket = None

    def left(self) -> float:
        return max(0.001, self._ends - time.monotonic())

    @property
    def over(self) -> bool:
        """Whether the time is up: a connect given the time left ends with its own timeout,
        which can come before the timer thread has marked the deadline passed."""
        return self.passed or time.monotonic() >= self._ends

    def hold(self, sock: socket.socket) -> None:
        """The call's socket: shut down at once if the time is up already."""
        with self._lock:
            self._socket = sock
            if self.passed:
                _shut(sock)

    def _cut(self) -> None:
        with self._lock:
            self.passed = True
            if self._socket is not None:
                _shut(self._socket)


def _shut(sock: socket.socket) -> None:
    # OSError: closed already, the call has ended.
    with contextlib.suppress(OSError):
        # The plain socket's: a TLS socket's own shutdown also drops its TLS state, which a
        # read in the calling thread is using.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Connection(http.client.HTTPConnection):
    """Hands its socket to the call's deadline from before it connects (a proxy's answer to
    CONNECT is read inside connect()), and again once connected (TLS wraps it anew)."""

    def __init__(self, deadline: _Deadline, host: str, **options: Any) -> None:
        super().__init__(host, **options)
        self._deadline = deadline
        # socket.create_connection, which HTTPConnection calls through this attribute, gives
        # each of a name's addresses the whole timeout, one after the other.
        self._create_connection = self._open_socket

    def connect(self) -> None:
        super().connect()
        self._deadline.hold(self.sock)

    def _open_socket(self, address: tuple[str, int], timeout: float | None,
                     source_address: tuple[str, int] | None = None) -> socket.socket:
        """socket.create_connection, each address tried for the time the call has left."""
        host, port = address
        failure: OSError | None = None
        for family, kind, protocol, _, where in _resolve(host, port, self._deadline):
            if self._deadline.over:
                break
            sock = socket.socket(family, kind, protocol)
            self._deadline.hold(sock)
            try:
                sock.settimeout(self._deadline.left())
                if source_address:
                    sock.bind(source_address)
                sock.connect(where)
            except OSError as exc:
                failure = exc
                sock.close()
                continue
            sock.settimeout(timeout)
            return sock
        raise failure if failure is not None else OSError(f"{host}:{port}: no address answered")


def _resolve(host: str, port: int, deadline: _Deadline) -> list[Any]:
    """The name's addresses within the time the call has left: the resolver's own timeouts (5 s
    a try, tries for each name server) held the call past its deadline. A lookup that has not
    answered by then is left to end in its own thread."""
    answer: queue.SimpleQueue[list[Any] | OSError] = queue.SimpleQueue()

    def look_up() -> None:
        try:
            answer.put(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as exc:
            answer.put(exc)

    threading.Thread(target=look_up, name="redrive-webhook-lookup", daemon=True).start()
    try:
        found = answer.get(timeout=deadline.left())
    except queue.Empty:
        raise TimeoutError(f"{host}: no address found in the time left") from None
    if isinstance(found, OSError):
        raise found
    return found


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    """The same over TLS: its connect() wraps the socket before the deadline gets it."""


class _BoundedHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Opens http:// and https:// URLs (in place of urllib's own handlers) on connections that
    hand their socket to the call's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        urllib.request.HTTPSHandler.__init__(self)
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection, req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._tls_connection, req)

    def _connection(self, host: str, **options: Any) -> _Connection:
        return _Connection(self._deadline, host, **options)

    def _tls_connection(self, host: str, **options: Any) -> _TLSConnection:
        return _TLSConnection(self._deadline, host, **options)
