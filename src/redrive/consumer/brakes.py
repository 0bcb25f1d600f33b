"""The consumer's dead-letter brake: each partition's recent outcomes checked against the policy's
DeadLetterLimit (a policy.brake.Window each), the partitions it stopped, and their release by an
operator or the cool-off.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from confluent_kafka import KafkaException

from redrive import kafka
from redrive.clock import now_ms
from redrive.control import ResumeWatch
from redrive.errors import RedriveError
from redrive.kafka.holds import Hold, Holds, Pausable, Why
from redrive.kafka.records import PartitionKey
from redrive.metrics import Metrics
from redrive.policy import DeadLetterLimit, format_ms
from redrive.policy.brake import Window
from redrive.record import Record

log = logging.getLogger("redrive.consumer")

# A braked partition without a cool-off stays held until an operator resumes it.
UNTIL_RESUMED_MS = 2**62


class Brake:
    """Stops a partition at the dead letter that would pass the limit, and lets it go again.

    The partition is held at that record (paused and sought back to it), so nothing is committed
    past it; a `redrive resume` for the group, or the cool-off, releases it with its counts
    started afresh. Requests are read from the control topic only while a partition is stopped.
    """

    def __init__(self, limit: DeadLetterLimit, group: str, metrics: Metrics,
                 watch: Callable[[], ResumeWatch], bootstrap: str,
                 retention_of: Callable[[str], int | None] = lambda topic: None) -> None:
        self.limit = limit
        self.group = group
        self.bootstrap = bootstrap  # for the resume command the warning prints
        # A held partition's records are still deleted by retention: the warning says by when.
        self._retention_of = retention_of
        self._metrics = metrics
        self._new_watch = watch
        self._watch: ResumeWatch | None = None
        self._windows: dict[PartitionKey, Window] = {}
        self.stopped: dict[PartitionKey, str] = {}  # braked partition -> its main topic
        # Braked partition -> the control topic's end at its trip: only requests from there on
        # release it.
        self._since: dict[PartitionKey, int] = {}

    @classmethod
    def of(cls, limit: DeadLetterLimit, group: str, metrics: Metrics,
           connection: kafka.Connection) -> Brake:
        bootstrap = str(kafka.client_config(connection)["bootstrap.servers"])
        return cls(limit, group, metrics, lambda: ResumeWatch(connection, group), bootstrap,
                   lambda topic: deleting_after(connection, topic))

    def _window(self, tp: PartitionKey) -> Window:
        window = self._windows.get(tp)
        if window is None:
            window = self._windows[tp] = Window(self.limit.window)
        return window

    def succeeded(self, tp: PartitionKey, count: int = 1) -> None:
        self._window(tp).add(count, False)

    def stops(self, consumer: Pausable, holds: Holds, tp: PartitionKey, record: Record,
              main: str) -> bool:
        """Count `record`'s dead letter and return False, or, if it would pass the limit, hold
        `tp` at it and return True: the caller then neither routes nor finishes it."""
        window = self._window(tp)
        if not window.passes(self.limit):
            window.add(1, True)
            return False
        if self._watch is None:
            self._watch = self._new_watch()
        # Before the log line: a resume sent by whoever reads it is written past this mark.
        self._since[tp] = self._watch.end()
        cool_off = self.limit.cool_off_ms
        until = UNTIL_RESUMED_MS if cool_off is None else now_ms() + cool_off
        holds.hold(consumer, tp, Hold(record.offset, until, Why.BRAKE, record.timestamp_ms))
        self.stopped[tp] = main
        self._metrics.brake_tripped(tp[0])
        self._metrics.braked_partitions(len(self.stopped))
        then = ("until resumed" if cool_off is None else f"for {cool_off / 1000:g} s or until "
                "resumed")
        log.warning("group %s: dead-letter brake stopped %s[%d] at offset %d (%s); held %s: "
                    "redrive resume -b %s --group %s --topic %s --partition %d%s",
                    self.group, tp[0], tp[1], record.offset, self.limit.describe(), then,
                    shlex.quote(self.bootstrap), self.group, tp[0], tp[1],
                    self._deadline(tp[0], record))
        return True

    def _deadline(self, topic: str, record: Record) -> str:
        retention = self._retention_of(topic)
        if retention is None or record.timestamp_ms <= 0:  # no timestamp: no date to give
            return ""
        at = datetime.fromtimestamp((record.timestamp_ms + retention) / 1000, UTC)
        return (f". {topic} deletes records after retention.ms={retention} "
                f"({format_ms(retention)}): resume before {at:%Y-%m-%d %H:%M:%S} UTC, when the "
                "held record and those behind it start to go unhandled")

    def poll_resumes(self, consumer: Pausable, holds: Holds) -> list[PartitionKey]:
        """Release the stopped partitions that resume requests since the trip cover."""
        if not self.stopped or self._watch is None:
            return []
        covered: list[PartitionKey] = []
        for offset, request in self._watch.poll():
            now = [tp for tp, main in self.stopped.items()
                   if tp not in covered and offset >= self._since.get(tp, 0)
                   and request.covers(tp, main)]
            if now:
                log.warning("group %s: resumed %s by %s", self.group,
                            ", ".join(f"{t}[{p}]" for t, p in now), request.actor or "?")
            covered += now
        released = holds.release(consumer, covered)
        self.released(released)
        return released

    def released(self, tps: Iterable[PartitionKey]) -> None:
        """Holds that ended (by a request or the cool-off): the braked partitions among them go
        on with their counts started afresh."""
        self.forget([tp for tp in tps if tp in self.stopped])

    def forget(self, tps: Iterable[PartitionKey]) -> None:
        """Drop these partitions' counts and stops (released, revoked or lost)."""
        for tp in tps:
            self._windows.pop(tp, None)
            self.stopped.pop(tp, None)
            self._since.pop(tp, None)
        self._metrics.braked_partitions(len(self.stopped))

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None


def deleting_after(connection: kafka.Connection, topic: str) -> int | None:
    """The topic's retention.ms where it deletes records by time; None where it keeps them for
    ever, or cannot be told (the warning is then made without it)."""
    try:
        kept = kafka.keeping(kafka.admin(connection), [topic], timeout_s=5).get(topic)
    except (RedriveError, KafkaException):
        return None
    return None if kept is None else kept.deletes_after_ms
