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
import socket
import threading
import urllib.error
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
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:
                    raise WebhookFailed(self.url, f"HTTP {exc.code}, a redirect to "
                                        f"{exc.headers.get('Location')!r}, not followed") from exc
                raise WebhookFailed(self.url, f"HTTP {exc.code}",
                                    transient=exc.code >= 500 or exc.code in (408, 429)) from exc
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                why = (f"no whole answer within {self.timeout_s:g}s" if deadline.passed
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
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._socket = None

    def hold(self, sock: socket.socket) -> None:
        """The call's socket, once connected: shut down at once if the time is up already."""
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
    """Hands its socket to the call's deadline once connected."""

    def __init__(self, deadline: _Deadline, host: str, **options: Any) -> None:
        super().__init__(host, **options)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self._deadline.hold(self.sock)


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
