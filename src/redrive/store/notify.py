"""Dead-record notifications: a callable hook, or a webhook that receives each dead record as JSON.

The scheduler delivers them: it claims dead rows not yet notified (several schedulers skip each
other's), calls every hook with no database lock held (a slow webhook would otherwise keep the
runtimes' writes waiting, on SQLite past their busy timeout), then marks the rows notified. A hook
that raises leaves the rest of the batch for a later pass, after `retry_after_s`; a scheduler
that dies while notifying leaves its claim, which a scheduler hands back after the claim time, so
those notifications are repeated: receivers should key on `id`.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from redrive.errors import InvalidArgument, RedriveError
from redrive.store.rows import StoredRetry
from redrive.store.store import RetryStore

log = logging.getLogger("redrive.store.notify")

DeadHook = Callable[[StoredRetry], object]
BATCH = 100


class WebhookFailed(RedriveError):
    def __init__(self, url: str, why: str) -> None:
        self.url = url
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


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # Followed, a 301/302/303 turned the POST into a GET with no body, whose 2xx marked the
    # record notified though the receiver never saw it; a 307/308 failed anyway.
    def redirect_request(self, *args: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class Webhook:
    """POST each dead record's description as JSON to `url`; any non-2xx answer is a failure,
    a redirect too (not followed: point the webhook at where it leads)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidArgument("webhook", url, "must be an http:// or https:// URL")
        self.url = url
        self.timeout_s = timeout_s

    def __call__(self, row: StoredRetry) -> None:
        body = json.dumps(describe(row)).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise WebhookFailed(self.url, f"HTTP {exc.code}, a redirect to "
                                    f"{exc.headers.get('Location')!r}, not followed") from exc
            raise WebhookFailed(self.url, f"HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise WebhookFailed(self.url, str(exc)) from exc
        if not 200 <= status < 300:
            raise WebhookFailed(self.url, f"HTTP {status}")

    def __repr__(self) -> str:
        return f"Webhook({self.url!r})"


class Notifier:
    def __init__(self, hooks: Sequence[DeadHook], *, retry_after_s: float = 30.0) -> None:
        for hook in hooks:
            if not callable(hook):
                raise InvalidArgument("on_dead", hook, "must be callable with a StoredRetry")
        self.hooks = list(hooks)
        self.retry_after_s = retry_after_s
        self._quiet_until = 0.0

    def deliver(self, store: RetryStore) -> int:
        """Notify dead records not notified yet; return how many were."""
        if not self.hooks or time.monotonic() < self._quiet_until:
            return 0
        done = 0
        with store.take_unnotified(BATCH) as batch:
            for row in batch.rows:
                try:
                    for hook in self.hooks:
                        hook(row)
                except Exception as exc:
                    log.warning("notification of dead record %d failed (%s); retrying in %.0fs",
                                row.id, exc, self.retry_after_s)
                    self._quiet_until = time.monotonic() + self.retry_after_s
                    break
                batch.notified(row.id)
                done += 1
        return done
