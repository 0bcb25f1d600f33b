"""The consumer runtime's two Kafka consumers: the group member, and a reader of its retry
partitions with a fetch queue of their own.

librdkafka puts every fetched record of a consumer in one local queue. Behind a backlog of the
main topics, a retry that fell due waits behind everything prefetched from them (the whole
backlog, on a broker that ignores fetch size limits): its lateness grows with the backlog. So the
group member subscribes to the main and retry topics, which keeps the group's assignment of
retry partitions across instances, but keeps its retry partitions paused; an assign-only reader
(never a group member) fetches exactly those partitions from the group's committed offsets into
its own queue, and the run loop takes its records first. Spring Kafka gets the same by reading
retry topics in containers of their own; here one thread drives both, so handling stays in
order per partition and commits stay with the member (its generation guards them, and a
transaction sends the member's group metadata for every offset).

Every pause, resume and seek goes to the consumer that fetches the partition; commits and group
metadata go to the member.

A held retry partition keeps the records the reader already returned from the held one on. When
it is resumed they are handed back, and it stays unassigned while they last: held again at one of
them, it keeps the rest without a call to the client; handled through, it is assigned again after
them. Copies in a retry partition fall due one after the other, so it is held at nearly every
record: fetching the rest again at each resume cost the reader 2.8-3.2 fetched records per retry
on noida-db, which answers a fetch with the whole rest of the partition, and an unassign and an
assign per record.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from redrive import kafka
from redrive.kafka.closing import close_within
from redrive.metrics import Metrics
from redrive.retention import report_gone

log = logging.getLogger("redrive.consumer")

# A reader whose every partition reached its end rests (its partitions unassigned) for REST_S. A
# broker that answers an empty fetch at once instead of waiting fetch.wait.max.ms (noida-db does)
# has librdkafka send fetches back to back for an idle partition, at the cost of a core between
# client and broker; resting bounds that to one fetch per REST_S, at most REST_S of added
# lateness. It rests only once each partition said it is at its end (a partition EOF event), so
# a fetch is never cut short.
REST_S = 0.025
# The member's fetch settings (the reader's are derived from them).
CONSUMER_OVERRIDES: Mapping[str, Any] = {
    # A resumed partition is fetched in the next fetch request; a shorter broker-side wait keeps
    # that close to the due time (lateness) when the other partitions are idle.
    "fetch.wait.max.ms": 100,
    # Fetched records wait in one local queue: a resumed retry partition's records land behind
    # everything prefetched from busy main partitions. A shallow prefetch keeps them close to
    # their due time at little cost in throughput.
    "queued.min.messages": 2000,
    # librdkafka postpones a partition's next fetch by this much once the local queue is over
    # that threshold (1 s by default): with a shallow queue, and a broker that answers a fetch
    # with more than asked for, every partition then stalls for a second at a time.
    "fetch.queue.backoff.ms": 10,
}


class Readers:
    """The member and, when the group has retry topics, the reader of its retry partitions."""

    def __init__(self, member: Consumer, reader: Consumer | None,
                 retry_topics: Collection[str], *, incremental: bool,
                 metrics: Metrics | None = None, group: str = "",
                 open_reader: Callable[[], Consumer] | None = None) -> None:
        self.member = member
        self._open_reader = open_reader
        # Where lost copies are reported when the group takes retry partitions (none: unchecked).
        self._metrics = metrics
        self._group = group
        self._incremental = incremental  # the group's rebalance protocol is cooperative
        self.reader = reader
        self._retry_topics = frozenset(retry_topics) if reader is not None else frozenset()
        self._reading: set[tuple[str, int]] = set()
        self._parked: dict[tuple[str, int], int] = {}  # held retry partition -> its offset
        self._resting: dict[tuple[str, int], int] | None = None  # rested partition -> position
        self._wake_at = 0.0
        self._at_end: set[tuple[str, int]] = set()  # partitions that reported their end
        # Where the reader was last placed in a partition (assigned at an offset, sought): its
        # position() is OFFSET_INVALID from then until it consumes a record there.
        self._placed: dict[tuple[str, int], int] = {}
        # Where each main partition was last sought (a hold, a rewind), for its resume.
        self._sought: dict[tuple[str, int], int] = {}
        # Retry partitions held, sought or revoked during the current consume() (see there).
        self._moved: set[tuple[str, int]] = set()
        # The retry records returned by the last consume_retries, by partition; those of a held
        # partition from its held record on are kept, and handed back first once it is resumed.
        self._returned: dict[tuple[str, int], list[Message]] = {}
        self._kept: dict[tuple[str, int], list[Message]] = {}
        self._ready: list[Message] = []  # kept records of resumed partitions, to hand back
        # Resumed partitions handing back what they kept: unassigned, with the offset after it.
        # Handed is set once the records are out: not held again by the next call, the
        # partition is assigned at that offset.
        self._draining: dict[tuple[str, int], list[int]] = {}  # tp -> [offset, handed]
        self._strays: set[tuple[str, int]] = set()  # retry partitions the member handed out
        self._closing = False  # the member's partitions were paused for good by serve_commits

    @classmethod
    def open(cls, connection: kafka.Connection, group: str, config: Mapping[str, Any],
             retry_topics: Collection[str], metrics: Metrics) -> Readers:
        """The member of `group` and, if there are retry topics, their reader."""
        member = kafka.consumer(connection, group, config)
        incremental = (config.get("group.protocol") == "consumer"
                       or "cooperative" in str(config.get("partition.assignment.strategy")))
        # Assign-only: it never joins the group, so a static member id is not its to use.
        reader_config = {k: v for k, v in config.items() if k != "group.instance.id"}
        reader_config["enable.partition.eof"] = True  # tells the reader when it may rest
        # auto.offset.reset is the user's say over the main topics. A retry partition the group
        # never committed on holds only its own unfinished copies: at latest, a member stopped
        # before its first commit there would leave them behind for good.
        reader_config["auto.offset.reset"] = "earliest"

        def open_reader() -> Consumer:
            return kafka.consumer(connection, group, reader_config)

        return cls(member, open_reader() if retry_topics else None, retry_topics,
                   incremental=incremental, metrics=metrics, group=group,
                   open_reader=open_reader)

    def read_retry_topics(self, topics: Collection[str]) -> None:
        """Retry topics found as the runtime goes (an earlier policy's): their partitions go to
        the reader (opened now if the group had none) once the member is given them, which it
        is only after it subscribes to them."""
        if self.reader is None:
            if self._open_reader is None:
                raise ValueError("these readers cannot open a reader of retry partitions")
            self.reader = self._open_reader()
        self._retry_topics = self._retry_topics | frozenset(topics)

    @property
    def reading_retries(self) -> bool:
        return bool(self._reading)

    def _split(self, partitions: Sequence[TopicPartition]
               ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        main = [p for p in partitions if p.topic not in self._retry_topics]
        retry = [p for p in partitions if p.topic in self._retry_topics]
        return main, retry

    # --- the group's assignment --------------------------------------------------------------

    def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        """Called from the member's assign callback: its retry partitions go to the reader."""
        _, retry = self._split(partitions)
        if not retry or self.reader is None:
            return
        # Assigned here rather than by the client after the callback, so that the pause is
        # applied to the assignment in effect (a pause made before it is reset by it): the
        # member never fetches them.
        if self._incremental:
            self.member.incremental_assign(list(partitions))
        else:
            self.member.assign(list(partitions))
        self.member.pause(retry)
        if self._metrics is not None:
            report_gone(self.member, [(str(p.topic), int(p.partition)) for p in retry],
                        self._metrics, f"group {self._group}")
        # OFFSET_INVALID: start at the group's committed offset (auto.offset.reset if none).
        self.reader.incremental_assign([TopicPartition(p.topic, p.partition, OFFSET_INVALID)
                                        for p in retry])
        self._reading.update((str(p.topic), int(p.partition)) for p in retry)
        for p in retry:
            self._placed.pop((str(p.topic), int(p.partition)), None)

    def revoked(self, partitions: Sequence[TopicPartition]) -> None:
        """Called from the member's revoke or lost callback, once nothing of them is pending."""
        _, retry = self._split(partitions)
        self._moved.update((str(p.topic), int(p.partition)) for p in retry)
        mine = [(str(p.topic), int(p.partition)) for p in retry
                if (p.topic, p.partition) in self._reading]
        if not mine or self.reader is None:
            return
        resting = self._resting if self._resting is not None else {}
        assigned = [TopicPartition(*tp) for tp in mine
                    if tp not in self._parked and tp not in resting and tp not in self._draining]
        if assigned:
            self.reader.incremental_unassign(assigned)
        gone = set(mine)
        self._ready = [m for m in self._ready if (m.topic(), m.partition()) not in gone]
        for tp in mine:
            self._kept.pop(tp, None)
            self._draining.pop(tp, None)
            self._returned.pop(tp, None)
            self._parked.pop(tp, None)
            resting.pop(tp, None)
            self._at_end.discard(tp)
            self._reading.discard(tp)
            self._placed.pop(tp, None)

    # --- fetching ------------------------------------------------------------------------------

    def consume_retries(self, count: int) -> list[Message]:
        """The retry records already fetched, without waiting."""
        if self.reader is None or not self._reading:
            return []
        self._returned = {}
        if self._draining:
            drained = [TopicPartition(t, p, offset)
                       for (t, p), (offset, handed) in self._draining.items() if handed]
            if drained:
                self.reader.incremental_assign(drained)
                for p in drained:
                    del self._draining[(p.topic, p.partition)]
                    self._placed[(p.topic, p.partition)] = p.offset
            for state in self._draining.values():
                state[1] = 1  # its records are handed back now (or were dropped by a seek)
        if self._ready:
            ready, self._ready = self._ready, []
            self._note_returned(ready)
            return ready
        if self._resting is not None:
            if time.monotonic() < self._wake_at:
                return []
            if self._resting:
                self.reader.incremental_assign([TopicPartition(t, p, offset)
                                                for (t, p), offset in self._resting.items()])
                self._placed.update(self._resting)
            self._resting = None
            self._at_end.clear()
        messages = self.reader.consume(count, 0)
        records = []
        for message in messages:
            tp = (message.topic(), message.partition())
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(tp)  # type: ignore[arg-type]
                continue
            self._at_end.discard(tp)
            records.append(message)
        if not records and self._reading - self._parked.keys() <= self._at_end:
            self._rest(time.monotonic())
        self._note_returned(records)
        return records

    def _note_returned(self, records: list[Message]) -> None:
        returned = self._returned
        for message in records:
            tp = (message.topic(), message.partition())
            found = returned.get(tp)  # type: ignore[arg-type]
            if found is None:
                returned[tp] = [message]  # type: ignore[index]
            else:
                found.append(message)

    def _keep(self, tp: tuple[str, int], offset: int) -> None:
        """Keep the records returned of `tp` from `offset` on, if the one at `offset` is there."""
        returned = self._returned.get(tp, ())
        for i, message in enumerate(returned):
            if message.offset() == offset:
                self._kept[tp] = list(returned[i:])
                return
        self._kept.pop(tp, None)

    def _rest(self, now: float) -> None:
        """Unassign the reader's quiet partitions for REST_S, at their positions."""
        assert self.reader is not None
        active = [TopicPartition(t, p) for t, p in sorted(self._reading)
                  if (t, p) not in self._parked and (t, p) not in self._draining]
        positions = self.reader.position(active) if active else []
        if active:
            self.reader.incremental_unassign(active)
        # Nothing consumed since the partition was placed: it rests where it was placed (taking
        # the committed offset instead would read again every record handled since the last
        # commit, at every rest while a commit waits for its copies). OFFSET_INVALID (nothing
        # read since the group's assignment) assigns again at the committed offset.
        self._resting = {}
        for tp in positions:
            key = (str(tp.topic), int(tp.partition))
            self._resting[key] = int(tp.offset) if tp.offset >= 0 else self._placed.get(
                key, OFFSET_INVALID)
        self._wake_at = now + REST_S

    def consume(self, count: int, wait_s: float, retries: list[Message]) -> list[Message]:
        """The member's records after `retries`, the reader's taken just before: one batch, so
        one commit (retry and main partitions are distinct, so each partition's records stay in
        order). A retry partition that a callback of this call held, sought or revoked loses its
        records in hand: the reader was placed at or below them, and handled now they would be
        committed past the record it was placed at (a copy refused while a cooperative revoke
        settled the copies in flight)."""
        self._moved.clear()
        messages = self.member.consume(count, wait_s)
        retry_topics = self._retry_topics
        if retry_topics and [m for m in messages if m.topic() in retry_topics]:
            messages = self._drop_strays(messages)
        if retries and self._moved:
            retries = [m for m in retries if (m.topic(), m.partition()) not in self._moved]
        return retries + messages if retries else messages

    def _drop_strays(self, messages: list[Message]) -> list[Message]:
        """Take out records of retry partitions, which the member holds paused, and pause them
        again.

        librdkafka does hand them out now and then: a pause made in the assign callback right
        after the assign is sometimes lost. Shown with confluent-kafka alone (2026-11-26, noida-db,
        the second core busy): a consumer subscribed to two topics, assigning both and pausing
        one in its callback, handed out the paused one's records from offset 0 about 130 ms later
        in 4 of 40 rounds. In CI the retry reader then handed out only the later part of a retry
        partition, and in make test a hold of a resting retry partition ended run(). Those
        records are the reader's to hand out, from its own position: handled from the member as
        well, one could be handled twice and out of order. Dropped here, they are neither
        handled nor committed, and the pause made now holds.
        """
        retry_topics = self._retry_topics
        strays = {(str(m.topic()), int(m.partition()))  # type: ignore[arg-type]
                  for m in messages if m.topic() in retry_topics and m.error() is None}
        if not strays:
            return messages  # only errors about retry partitions: the run loop reports them
        new = strays - self._strays
        if new:
            log.warning("the group member was handed records of retry partitions it holds "
                        "paused (%s); they are left to the retry reader and paused again",
                        ", ".join(f"{t}[{p}]" for t, p in sorted(new)))
            self._strays |= new
        self.member.pause([TopicPartition(t, p) for t, p in sorted(strays)])
        return [m for m in messages if m.topic() not in retry_topics or m.error() is not None]

    # --- what Holds and the Committer ask of "the consumer" ------------------------------------

    # The reader holds a retry partition by unassigning it and assigning it again at the held
    # offset: resumed after a pause, a partition of an otherwise idle consumer is fetched only at
    # librdkafka's next one-second tick (0.5-1 s late on noida-db), assigned it is fetched at once.

    def pause(self, partitions: list[TopicPartition]) -> None:
        main, retry = self._split(partitions)
        self._moved.update((p.topic, p.partition) for p in retry)
        if main:
            self.member.pause(main)
        parked = [p for p in retry if (p.topic, p.partition) in self._reading]
        if not parked or self.reader is None:
            return
        # Only a partition the reader has is unassigned (librdkafka refuses any other): one
        # handing back what it kept, already held, or resting is unassigned already.
        assigned = []
        for p in parked:
            tp = (p.topic, p.partition)
            if self._draining.pop(tp, None) is not None:
                # Held before its kept records were all handed back: those left go (what it
                # keeps now is taken from the records in hand).
                self._ready = [m for m in self._ready if (m.topic(), m.partition()) != tp]
            elif tp in self._parked:
                pass
            elif self._resting is not None and tp in self._resting:
                del self._resting[tp]  # not to be assigned when the rest is over
            else:
                assigned.append(TopicPartition(p.topic, p.partition))
        if assigned:
            self.reader.incremental_unassign(assigned)
        for p in parked:
            self._parked[(p.topic, p.partition)] = p.offset
            self._keep((p.topic, p.partition), p.offset)

    def resume(self, partitions: list[TopicPartition]) -> None:
        main, retry = self._split(partitions)
        if main:
            self.member.resume(main)
            # The same one-second tick for a main partition (an in-place retry's 100 ms backoff
            # waited about a second): sought again where it was last sought (its hold, or a
            # rewind since; paused, it read nothing after), it is fetched at once.
            for p in main:
                offset = self._sought.pop((p.topic, p.partition), None)
                if offset is not None:
                    # Not assigned any more (lost): its next owner reads it.
                    with contextlib.suppress(KafkaException):
                        self.member.seek(TopicPartition(p.topic, p.partition, offset))
        parked = []
        for p in retry:
            tp = (p.topic, p.partition)
            if tp not in self._parked:
                continue
            offset = self._parked.pop(tp)
            kept = self._kept.pop(tp, None)
            if kept:
                self._ready.extend(kept)
                self._draining[tp] = [kept[-1].offset() + 1, 0]  # type: ignore[operator]
            else:
                parked.append(TopicPartition(p.topic, p.partition, offset))
        if parked and self.reader is not None:
            self.reader.incremental_assign(parked)
            self._placed.update(((p.topic, p.partition), p.offset) for p in parked)

    def seek(self, partition: TopicPartition) -> None:
        tp = (partition.topic, partition.partition)
        if partition.topic in self._retry_topics:
            self._moved.add(tp)
        if tp in self._parked:
            self._parked[tp] = partition.offset
            kept = self._kept.get(tp)
            if kept and kept[0].offset() != partition.offset:
                del self._kept[tp]
        elif tp in self._draining:
            # Sought elsewhere before its kept records were handed back: they go.
            self._draining[tp][0] = partition.offset
            self._ready = [m for m in self._ready if (m.topic(), m.partition()) != tp]
        elif self._resting is not None and tp in self._resting:
            self._resting[tp] = partition.offset
        elif partition.topic in self._retry_topics and self.reader is not None:
            self.reader.seek(partition)
            self._placed[tp] = partition.offset
        else:
            self.member.seek(partition)
            self._sought[tp] = partition.offset

    def commit(self, **kwargs: Any) -> Any:
        return self.member.commit(**kwargs)

    def consumer_group_metadata(self) -> Any:
        return self.member.consumer_group_metadata()

    def serve_commits(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the member's callbacks (the outcomes of its commits), on
        the way out: its partitions are paused first, and a record it returns anyway is
        dropped, neither handled nor committed."""
        if not self._closing:
            self._closing = True
            self.member.pause(self.member.assignment())
        self.member.consume(1, timeout_s)

    def close(self, deadline: float, who: str) -> None:
        """Close both consumers, giving up waiting at the monotonic `deadline` (see
        `redrive.kafka.closing`)."""
        def close_both() -> None:
            # The member first: leaving the group runs the revoke callback, which still uses
            # the reader.
            try:
                self.member.close()
            finally:
                if self.reader is not None:
                    self.reader.close()

        close_within(close_both, deadline, who)
