"""Operators' requests to running consumers, over one control topic.

`redrive resume` writes a request to `redrive.control` (one partition, keyed by group, created
when missing); a consumer whose partition the dead-letter brake stopped reads the requests written
after the brake tripped there and releases the partitions a request for its group covers. A
request written before that trip (while nothing was stopped, or before a cool-off ended an
earlier stop) releases nothing: it was meant for another stop. A topic rather
than a signal or a file: consumers run on many hosts, and the request is then also a record of who
resumed what and when.

A Spark pipeline's stops are written there too (`Stop`): its query reads its partitions as one
and fails the batch that tripped, so the stop must outlive the query, and the process, that
tripped it; whoever starts the query again reads the group's stops (`standing_stops`).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from redrive import kafka
from redrive.clock import now_ms
from redrive.errors import BrokerUnavailable, InvalidArgument
from redrive.kafka.records import Delivered, OutRecord, PartitionKey

CONTROL_TOPIC = "redrive.control"
RESUME = "resume"
STOP = "stop"

log = logging.getLogger("redrive.control")


@dataclass(frozen=True)
class Resume:
    """Resume a group's braked partitions: all of them, a topic's, or one partition's."""

    group: str
    topic: str | None = None
    partition: int | None = None
    actor: str = ""
    at_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise InvalidArgument("group", self.group, "must be a non-empty group name")
        if self.partition is not None and (isinstance(self.partition, bool)
                                           or not isinstance(self.partition, int)
                                           or self.partition < 0):
            raise InvalidArgument("partition", self.partition, "must be an integer >= 0")
        if self.partition is not None and self.topic is None:
            raise InvalidArgument("partition", self.partition, "needs a topic")

    def covers(self, tp: PartitionKey, main: str) -> bool:
        """Whether this request releases `tp`, a partition of `main` or of one of its retry
        topics (a topic named in the request may be either)."""
        if self.topic is None:
            return True
        if self.topic not in (tp[0], main):
            return False
        return self.partition is None or (self.topic == tp[0] and self.partition == tp[1])

    def encode(self) -> bytes:
        return json.dumps({"action": RESUME, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Resume:
        found = decode(value)
        if not isinstance(found, Resume):
            raise InvalidArgument("control request", value, f"expected action {RESUME!r}")
        return found


@dataclass(frozen=True)
class Stop:
    """A partition a Spark pipeline's dead-letter brake stopped at `offset` (a partition of
    `main` or of one of its retry topics), at `at_ms`; `cool_off_ms` then releases it by itself.
    `limit` says which limit it passed, for the operator."""

    group: str
    topic: str
    partition: int
    offset: int
    main: str
    at_ms: int
    cool_off_ms: int | None = None
    limit: str = ""

    def __post_init__(self) -> None:
        for name in ("group", "topic", "main"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgument(f"stop.{name}", getattr(self, name), "must be a name")
        numbers = ["partition", "offset", "at_ms"]
        if self.cool_off_ms is not None:
            numbers.append("cool_off_ms")
        for name in numbers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"stop.{name}", value, "must be an integer >= 0")

    @property
    def tp(self) -> PartitionKey:
        return (self.topic, self.partition)

    def encode(self) -> bytes:
        return json.dumps({"action": STOP, **asdict(self)}, sort_keys=True).encode()


def decode(value: bytes | None) -> Resume | Stop:
    """A record of the control topic; InvalidArgument naming it when it is neither."""
    try:
        fields = json.loads(value or b"")
    except ValueError as exc:
        raise InvalidArgument("control request", value, f"not JSON: {exc}") from exc
    kinds: dict[str, type[Resume] | type[Stop]] = {RESUME: Resume, STOP: Stop}
    kind = kinds.get(fields.pop("action", None)) if isinstance(fields, dict) else None
    if kind is None:
        raise InvalidArgument("control request", value,
                              f"expected action {RESUME!r} or {STOP!r}")
    try:
        return kind(**fields)
    except TypeError as exc:
        raise InvalidArgument("control request", value, str(exc)) from exc


@dataclass(frozen=True)
class Standing:
    """A group's Spark stops as the control topic tells them: those still in force, and, per
    partition, the offset where the last released one stood (counts start afresh there)."""

    active: tuple[Stop, ...]
    released: dict[PartitionKey, int]


def standing_stops(connection: kafka.Connection, group: str, timeout_s: float = 10.0,
                   at_ms: int | None = None) -> Standing:
    """Read the control topic whole (a few records an incident) for `group`'s stops: a stop is
    released by a resume for the group written after it that covers its partition, or once its
    cool-off has passed (at `at_ms`, now by default)."""
    now = now_ms() if at_ms is None else at_ms
    stops: dict[PartitionKey, tuple[int, Stop]] = {}
    released: dict[PartitionKey, int] = {}
    if CONTROL_TOPIC not in kafka.topic_partitions(kafka.admin(connection), timeout_s):
        return Standing((), {})  # nothing ever stopped or resumed; not made by a look
    consumer = kafka.consumer(connection)
    try:
        low, high = kafka.watermarks(consumer, CONTROL_TOPIC, 0, timeout_s)
        if high > low:
            consumer.assign([TopicPartition(CONTROL_TOPIC, 0, low)])
            for offset, found in _read(consumer, connection, group, low, high, timeout_s):
                if isinstance(found, Stop):
                    stops[found.tp] = (offset, found)
                    continue
                for tp, (since, stop) in list(stops.items()):
                    if offset > since and found.covers(tp, stop.main):
                        released[tp] = stop.offset
                        del stops[tp]
    finally:
        consumer.close()
    active = []
    for tp, (_, stop) in sorted(stops.items()):
        if stop.cool_off_ms is not None and stop.at_ms + stop.cool_off_ms <= now:
            released[tp] = stop.offset
        else:
            active.append(stop)
    return Standing(tuple(active), released)


def _read(consumer: Consumer, connection: kafka.Connection, group: str, start: int, end: int,
          timeout_s: float) -> list[tuple[int, Resume | Stop]]:
    """The control topic's records for `group` from `start` (assigned there) below `end`, with
    their offsets."""
    found: list[tuple[int, Resume | Stop]] = []
    deadline = time.monotonic() + timeout_s
    read_to = start
    while read_to < end:
        if time.monotonic() > deadline:
            raise BrokerUnavailable(str(kafka.client_config(connection)["bootstrap.servers"]),
                                    f"{CONTROL_TOPIC} not read to offset {end} in {timeout_s:g} "
                                    f"s (read to {read_to})")
        # As many as are left, so that consume returns once they are in, not at its timeout.
        for message in consumer.consume(max(1, min(500, end - read_to)), 0.5):
            if message.error() is not None:
                continue
            offset = int(message.offset() or 0)
            read_to = offset + 1
            if offset >= end or message.key() != group.encode():
                continue
            try:
                found.append((offset, decode(message.value())))
            except InvalidArgument as exc:
                log.warning("group %s: ignored control record at offset %d: %s", group,
                            offset, exc)
    return found


def resume_command(connection: kafka.Connection, group: str, stops: Sequence[Stop]) -> str:
    """The `redrive resume` command that releases `stops` (one partition's, or the group's)."""
    bootstrap = str(kafka.client_config(connection)["bootstrap.servers"])
    command = f"redrive resume -b {shlex.quote(bootstrap)} --group {shlex.quote(group)}"
    if len(stops) == 1:
        command += f" --topic {shlex.quote(stops[0].topic)} --partition {stops[0].partition}"
    return command


def write_stops(connection: kafka.Connection, stops: list[Stop],
                timeout_s: float = 10.0) -> list[Delivered]:
    """Record a Spark pipeline's stops (before its batch fails: a resume written after them,
    and only such, releases them)."""
    kafka.create_topics(kafka.admin(connection), {CONTROL_TOPIC: 1}, timeout_s=timeout_s)
    records = [OutRecord(CONTROL_TOPIC, stop.encode(), stop.group.encode()) for stop in stops]
    return kafka.produce_confirmed(kafka.producer(connection), records, timeout_s)


def request_resume(connection: kafka.Connection, resume: Resume,
                   timeout_s: float = 10.0) -> Delivered:
    """Write `resume` to the control topic (created if missing); return where it landed.
    Raises BrokerUnavailable when no broker answers, and InvalidArgument when no consumer of
    the group runs and no Spark pipeline of it stands stopped: only a running consumer holds a
    braked partition (a restart starts the brake's counts afresh), and a pipeline's stops are
    in the control topic, so a request then, or for a mistyped group, would change nothing."""
    kafka.check_reachable(connection, timeout_s)
    # Not allowed to describe the group (an ACL): the request is written all the same.
    if kafka.group_members(kafka.admin(connection), resume.group, timeout_s) == 0 \
            and not standing_stops(connection, resume.group, timeout_s).active:
        raise InvalidArgument("group", resume.group, "no consumer of this group is running and "
                              "no Spark pipeline of it is stopped, so no partition of it is "
                              "braked")
    kafka.create_topics(kafka.admin(connection), {CONTROL_TOPIC: 1}, timeout_s=timeout_s)
    producer = kafka.producer(connection)
    record = OutRecord(CONTROL_TOPIC, resume.encode(), resume.group.encode())
    return kafka.produce_confirmed(producer, [record], timeout_s)[0]


class ResumeWatch:
    """The resume requests for one group written from now on (the topic's end when made)."""

    def __init__(self, connection: kafka.Connection, group: str,
                 timeout_s: float = 10.0) -> None:
        self.group = group
        self._timeout_s = timeout_s
        kafka.create_topics(kafka.admin(connection), {CONTROL_TOPIC: 1}, timeout_s=timeout_s)
        self._consumer: Consumer = kafka.consumer(connection)
        _, self._read_to = kafka.watermarks(self._consumer, CONTROL_TOPIC, 0, timeout_s)
        self._consumer.assign([TopicPartition(CONTROL_TOPIC, 0, self._read_to)])

    def end(self) -> int:
        """The offset of the next request written: those below it were written before now. Where
        no broker answers, the offset this watch reads next (what it has not read may then be
        older than now)."""
        try:
            return kafka.watermarks(self._consumer, CONTROL_TOPIC, 0, self._timeout_s)[1]
        except KafkaException as exc:
            log.warning("group %s: the end of %s could not be read (%s); requests not read yet "
                        "count as newer", self.group, CONTROL_TOPIC, exc.args[0])
            return self._read_to

    def poll(self) -> list[tuple[int, Resume]]:
        """The requests for this group that arrived since the last poll, with their offsets;
        never blocks."""
        found: list[tuple[int, Resume]] = []
        for message in self._consumer.consume(100, 0):
            if message.error() is not None:
                continue
            offset = int(message.offset() or 0)
            self._read_to = offset + 1
            if message.key() != self.group.encode():
                continue
            try:
                request = decode(message.value())
            except InvalidArgument as exc:
                log.warning("group %s: ignored control record at offset %s: %s", self.group,
                            message.offset(), exc)
                continue
            if isinstance(request, Resume):  # a Spark pipeline's stops are its own
                found.append((offset, request))
        return found

    def close(self) -> None:
        self._consumer.close()
