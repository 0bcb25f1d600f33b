"""Dead-record notifications: callable hooks (a Webhook among them), called for each dead record.

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

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redrive.errors import InvalidArgument
from redrive.metrics import Metrics
from redrive.store.claims import Unnotified
from redrive.store.rows import StoredRetry
from redrive.store.store import RetryStore
from redrive.store.webhook import WebhookFailed

log = logging.getLogger("redrive.store.notify")

DeadHook = Callable[[StoredRetry], object]
BATCH = 100
# Rows whose notifications failed one after the other in a pass: the receiver is likely down.
DOWN_AFTER = 3


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
    and only if the receiver refused the row (not a webhook unreachable, timed out, answering
    5xx, 408 or 429, or not in HTTP): otherwise the receiver may be down for all of them, and
    the rows are kept. After `tries` such failures the row is given up: logged as an error,
    counted in `redrive_notifications_given_up_total`, and marked notified, so no scheduler
    tries it again. A pass stops once `DOWN_AFTER` rows in a row failed, and after it, or after
    one in which nothing went through, the next waits `retry_after_s`: a receiver that is down
    is not called once per row every pass.
    """

    def __init__(self, hooks: Sequence[DeadHook], *, retry_after_s: float = 30.0,
                 tries: int = 5, metrics: Metrics | None = None) -> None:
        for hook in hooks:
            if not callable(hook):
                raise InvalidArgument("on_dead", hook, "must be callable with a StoredRetry")
        self.hooks = list(hooks)
        self.retry_after_s = retry_after_s
        self.tries = tries
        self.metrics = metrics
        if metrics is not None:
            # The series exists from the start, at 0: a scheduler's first give-up, after a
            # restart too, is then an increase an alert sees.
            metrics.notification_given_up(0)
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
                if self.metrics is not None:
                    self.metrics.notification_given_up()
                continue
            failing.retry_at = now + self.retry_after_s * 2 ** failing.tries
            if held:
                log.warning("notification of dead record %d failed (%r: %s); retrying in %.0fs",
                            row.id, hook, exc, failing.retry_at - now)
