"""Dead-record notifications: a callable hook, or a webhook that receives each dead record as JSON.

The scheduler delivers them: it claims dead rows not yet notified (several schedulers skip each
other's), calls every hook with no database lock held (a slow webhook would otherwise keep the
runtimes' writes waiting, on SQLite past their busy timeout), then marks the rows notified. A row
whose hook raises is tried again later, the others going on (see Notifier, which gives up on it
after a few tries); a pass hands back the rows it has not reached once half the claim time has
passed, before another scheduler would take the claim over; a scheduler that dies while
notifying leaves its claim, which a scheduler hands back after the claim time, so those
notifications are repeated: receivers should key on `id`.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redrive.errors import InvalidArgument, RedriveError
from redrive.store.claims import Unnotified
from redrive.store.rows import StoredRetry
from redrive.store.store import RetryStore

log = logging.getLogger("redrive.store.notify")

DeadHook = Callable[[StoredRetry], object]
BATCH = 100
# Rows whose notifications failed one after the other in a pass: the receiver is likely down.
DOWN_AFTER = 3


class WebhookFailed(RedriveError):
    """transient: the receiver did not take any record just then (unreachable, timed out, 5xx,
    408, 429), rather than refused this one."""

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
            raise WebhookFailed(self.url, f"HTTP {exc.code}",
                                transient=exc.code >= 500 or exc.code in (408, 429)) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise WebhookFailed(self.url, str(exc), transient=True) from exc
        if not 200 <= status < 300:
            raise WebhookFailed(self.url, f"HTTP {status}")

    def __repr__(self) -> str:
        return f"Webhook({self.url!r})"


@dataclass
class _Failing:
    """A row whose notification failed: when it may be tried again, and how many of its
    failures count against it."""

    retry_at: float  # time.monotonic()
    tries: int = 0


class Notifier:
    """Calls the hooks for each dead row, and keeps, in memory, the rows whose hooks failed.

    A row that fails is set aside (`retry_after_s`, doubling with each failure held against it)
    while the others go on, and tried after them. Its failure is held against it only in a pass
    where another row's notification went through and that did not end on a run of failures,
    and only if the receiver refused the row (not a webhook unreachable, timed out, or answering
    5xx, 408 or 429): otherwise the receiver may be down for all of them, and the rows are
    kept. After `tries` such failures the row is given up: logged as an error and marked
    notified, so no scheduler tries it again. A pass stops once `DOWN_AFTER` rows in a row
    failed, and after it, or after one in which nothing went through, the next waits
    `retry_after_s`: a receiver that is down is not called once per row every pass.
    """

    def __init__(self, hooks: Sequence[DeadHook], *, retry_after_s: float = 30.0,
                 tries: int = 5) -> None:
        for hook in hooks:
            if not callable(hook):
                raise InvalidArgument("on_dead", hook, "must be callable with a StoredRetry")
        self.hooks = list(hooks)
        self.retry_after_s = retry_after_s
        self.tries = tries
        self._quiet_until = 0.0
        self._failing: dict[int, _Failing] = {}  # by row id

    def deliver(self, store: RetryStore, claim_s: float) -> int:
        """Notify dead records not notified yet; return how many were. Rows still waiting once
        half of `claim_s` has passed are handed back for the next pass: past the claim, another
        scheduler would hand the claim back and notify them too."""
        started = time.monotonic()
        if not self.hooks or started < self._quiet_until:
            return 0
        # Large enough for a whole batch besides the rows set aside.
        with store.take_unnotified(BATCH + len(self._failing)) as batch:
            # Those not claimed now were notified, requeued or taken by another scheduler.
            self._failing = {row.id: self._failing[row.id] for row in batch.rows
                             if row.id in self._failing}
            ready = [row for row in batch.rows if row.id not in self._failing
                     or self._failing[row.id].retry_at <= started]
            # Failed before: after the others, which tell whether the receiver works at all.
            ready.sort(key=lambda row: row.id in self._failing)
            failed: list[tuple[StoredRetry, DeadHook, Exception]] = []
            done = running = 0  # rows notified; failures since the last that went through
            for row in ready:
                if time.monotonic() - started >= claim_s / 2:
                    log.warning("notifying dead records took half of the %.0fs claim; %d "
                                "left for the next pass", claim_s, len(ready) - done - len(failed))
                    break
                failure = self._notify(row)
                if failure is None:
                    batch.notified(row.id)
                    self._failing.pop(row.id, None)
                    done, running = done + 1, 0
                    continue
                failed.append((row, *failure))
                running += 1
                if running >= DOWN_AFTER:
                    break
            # Failures count against their rows only where others went through, and not in a
            # pass that ended on a run of them: the receiver may have gone down meanwhile.
            self._failed(batch, failed, held=done > 0 and running < DOWN_AFTER)
            if batch.rows and not ready:
                # Every row claimed is set aside: claiming them each pass only to hand them
                # back would write to the store for nothing.
                soonest = min(failing.retry_at for failing in self._failing.values())
                self._quiet_until = min(soonest, started + self.retry_after_s)
            if failed and (not done or running >= DOWN_AFTER):
                row, hook, exc = failed[-1]
                log.warning("notifications failing (the last: dead record %d, %r: %s); "
                            "retrying in %.0fs", row.id, hook, exc, self.retry_after_s)
                self._quiet_until = time.monotonic() + self.retry_after_s
        return done

    def _notify(self, row: StoredRetry) -> tuple[DeadHook, Exception] | None:
        for hook in self.hooks:
            try:
                hook(row)
            except Exception as exc:
                return hook, exc
        return None

    def _failed(self, batch: Unnotified,
                failed: Sequence[tuple[StoredRetry, DeadHook, Exception]], *,
                held: bool) -> None:
        now = time.monotonic()
        for row, hook, exc in failed:
            failing = self._failing.setdefault(row.id, _Failing(now))
            if held and not (isinstance(exc, WebhookFailed) and exc.transient):
                failing.tries += 1
            if failing.tries >= self.tries:
                log.error("giving up on notifying dead record %d: %r failed %d times while "
                          "other records were notified, the last time with %s: %s; marked "
                          "notified", row.id, hook, failing.tries, type(exc).__name__, exc)
                batch.notified(row.id)
                del self._failing[row.id]
                continue
            failing.retry_at = now + self.retry_after_s * 2 ** failing.tries
            if held:
                log.warning("notification of dead record %d failed (%r: %s); retrying in %.0fs",
                            row.id, hook, exc, failing.retry_at - now)
