"""Operators' requests to running consumers, over one control topic.

`redrive resume` writes a request to `redrive.control` (one partition, keyed by group, created
when missing); a consumer whose partition the dead-letter brake stopped reads the requests written
after the brake tripped there and releases the partitions a request for its group covers. A
request written before that trip (while nothing was stopped, or before a cool-off ended an
earlier stop) releases nothing: it was meant for another stop. A topic rather
than a signal or a file: consumers run on many hosts, and the request is then also a record of who
resumed what and when.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.kafka.records import Delivered, OutRecord, PartitionKey

CONTROL_TOPIC = "redrive.control"
RESUME = "resume"

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
        try:
            fields = json.loads(value or b"")
        except ValueError as exc:
            raise InvalidArgument("control request", value, f"not JSON: {exc}") from exc
        if not isinstance(fields, dict) or fields.pop("action", None) != RESUME:
            raise InvalidArgument("control request", value, f"expected action {RESUME!r}")
        try:
            return cls(**fields)
        except TypeError as exc:
            raise InvalidArgument("control request", value, str(exc)) from exc


def request_resume(connection: kafka.Connection, resume: Resume,
                   timeout_s: float = 10.0) -> Delivered:
    """Write `resume` to the control topic (created if missing); return where it landed.
    Raises BrokerUnavailable when no broker answers, and InvalidArgument when no consumer of
    the group runs: only a running consumer holds a braked partition and reads requests (a
    restart starts the brake's counts afresh), so a request then, or for a mistyped group,
    would change nothing."""
    kafka.check_reachable(connection, timeout_s)
    # Not allowed to describe the group (an ACL): the request is written all the same.
    if kafka.group_members(kafka.admin(connection), resume.group, timeout_s) == 0:
        raise InvalidArgument("group", resume.group, "no consumer of this group is running, so "
                              "no partition of it is braked")
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
                found.append((offset, Resume.decode(message.value())))
            except InvalidArgument as exc:
                log.warning("group %s: ignored control record at offset %s: %s", self.group,
                            message.offset(), exc)
        return found

    def close(self) -> None:
        self._consumer.close()
