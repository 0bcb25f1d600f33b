"""The source's driver side: offsets as Spark checkpoints them, the rate limit, and the gate scan.

Offsets, in the checkpoint and between the source's methods, are JSON dicts of the next offset to
read per partition: `{"orders": {"0": 12, "1": 40}}`. The driver plans ranges; executors read
exactly `[start, end)` of one Kafka partition each (see `readers`).

The gate scan. Reading headers costs a full fetch of every record, so the driver scans only the
topics the gate applies to: those named by `redrive.gatedTopics` (comma list; each entry is a
topic name or a regular expression matching whole names), or every subscribed topic when that
option is absent. Per partition the driver remembers how far it has scanned and the first record
held back with its due time; a held partition is not read again until that due time has passed,
and records already found due are never scanned twice. Topics outside the gate are not scanned.

Everything here lives in the Python process that serves the streaming source and is never
pickled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from redrive import gate, kafka
from redrive.errors import BrokerUnavailable, RedriveError
from redrive.kafka.ranges import (
    CONSUME_BATCH,
    LastClientError,
    PartitionRange,
    RangeReader,
    range_consumer,
)
from redrive.kafka.records import PartitionKey, readable_headers
from redrive.spark.options import (
    EARLIEST,
    LATEST,
    STRATEGY_OPTION,
    ByTimestamp,
    OffsetsSpec,
    SourceOptionError,
    SourceOptions,
)

log = logging.getLogger(__name__)

Offsets = dict[PartitionKey, int]


class DataLoss(RedriveError):
    """Records the query still had to read are gone (retention, deletion, topic recreated)."""

    def __init__(self, topic: str, partition: int, why: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"data loss on {topic}[{partition}]: {why}; set option "
                         "failOnDataLoss=false (fail_on_data_loss=False of RetryPipeline "
                         "and retry_stream) to continue from what is left")


def _check_named(spec: Mapping[PartitionKey, int], tps: Sequence[PartitionKey], option: str,
                 raw: str) -> None:
    """Offsets or times given per partition name exactly the subscribed topics' partitions."""
    missing = [tp for tp in tps if tp not in spec]
    unknown = [tp for tp in spec if tp not in tps]
    if missing or unknown:
        tp, why = ((missing[0], "is not given; name every partition of the subscribed topics")
                   if missing else (unknown[0], "does not exist"))
        raise SourceOptionError(option, raw, f"partition {tp[0]}[{tp[1]}] {why}")


def _ordered(offsets: Mapping[PartitionKey, int]) -> list[tuple[PartitionKey, int]]:
    return sorted(offsets.items(), key=lambda item: item[0])


def offsets_to_json(offsets: Mapping[PartitionKey, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark checkpoints them. Key order is fixed (topic, then partition number)
    because Spark compares offsets as JSON text: a reordering would look like new data."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in _ordered(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(data: Mapping[str, Any] | None) -> Offsets:
    offsets: Offsets = {}
    for topic, partitions in (data or {}).items():
        for partition, offset in partitions.items():
            offsets[(topic, int(partition))] = int(offset)
    return offsets


def rate_limit(start: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int],
               max_rows: int) -> Offsets:
    """Ends that admit at most `max_rows` records in all, shared in proportion to each partition's
    backlog (as Spark's Kafka source does), but never more than the limit in total."""
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * size / total for tp, size in backlog.items()}
    granted = {tp: int(share) for tp, share in shares.items()}
    left = max_rows - sum(granted.values())
    for tp in sorted(shares, key=lambda tp: (granted[tp] - shares[tp], tp))[:left]:
        granted[tp] += 1
    # An end below its start (a partition restarted at its earliest offset) stays as it is.
    return {tp: min(latest[tp], start[tp] + granted[tp]) for tp in latest}


@dataclass
class Scan:
    """What the driver knows of a gated partition: every record in [start, clear_to) is due;
    if held_due is set, the record at clear_to is not due before that time."""

    start: int
    clear_to: int
    held_due: int | None = None



def _due(message: Message) -> int | None:
    # A record whose header names are not all UTF-8 is due now: the reader shows it with
    # `redrive.malformed` set, for the pipeline to dead-letter; held, it would stall its
    # partition for good.
    headers, unreadable = readable_headers(message)
    return None if unreadable is not None else gate.due_of(headers)


class Broker:
    """The driver's long-lived clients: metadata and offsets, the gate scan, group commits.

    Lives in the Python process that serves the streaming source; never pickled."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: kafka.Admin | None = None
        self._scanner: Consumer | None = None
        self._committer: Consumer | None = None
        self._errors = LastClientError()

    def close(self) -> None:
        for client in (self._scanner, self._committer):
            if client is not None:
                client.close()
        self._scanner = self._committer = self._admin = None

    @property
    def admin(self) -> kafka.Admin:
        if self._admin is None:
            self._admin = kafka.admin(self.options.bootstrap, self.options.client_overrides)
        return self._admin

    def partitions(self, *, require_all: bool) -> list[PartitionKey]:
        """The subscribed topics' partitions; with require_all, a missing topic is an error."""
        counts = kafka.topic_partitions(self.admin)
        missing = [t for t in self.options.topics if t not in counts]
        if missing and require_all:
            raise SourceOptionError("subscribe", ",".join(self.options.topics),
                                    f"topic {missing[0]!r} does not exist at "
                                    f"bootstrap.servers={self.options.bootstrap!r}")
        for topic in missing:
            log.warning("subscribed topic %r no longer exists; its offsets are kept", topic)
        return [(t, p) for t in self.options.topics if t in counts for p in range(counts[t])]

    def list_offsets(self, tps: Sequence[PartitionKey], which: str) -> Offsets:
        """Earliest or latest offsets; latest is the last stable offset under read_committed,
        so a range never waits for a transaction that is still open."""
        spec = (OffsetSpec.earliest() if which == "earliest"  # type: ignore[no-untyped-call]
                else OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return self._list_offsets({tp: spec for tp in tps}, which)

    def offsets_at(self, times: Mapping[PartitionKey, int]) -> Offsets:
        """In each partition, the offset of the first record whose timestamp is at or after the
        given time; -1 where there is none."""
        return self._list_offsets({tp: OffsetSpec.for_timestamp(at)
                                   for tp, at in times.items()}, "timestamp")

    def _list_offsets(self, specs: Mapping[PartitionKey, OffsetSpec], which: str) -> Offsets:
        if not specs:
            return {}
        isolation = (IsolationLevel.READ_COMMITTED if self.options.read_committed
                     else IsolationLevel.READ_UNCOMMITTED)
        try:
            futures = self.admin.list_offsets({TopicPartition(t, p): spec
                                               for (t, p), spec in specs.items()},
                                              isolation_level=isolation, request_timeout=30)
            return {(tp.topic, tp.partition): int(future.result().offset)
                    for tp, future in futures.items()}
        except KafkaException as exc:
            raise BrokerUnavailable(self.options.bootstrap,
                                    f"listing {which} offsets failed: {exc.args[0]}") from exc

    def resolve(self, spec: OffsetsSpec, tps: Sequence[PartitionKey],
                option: str) -> Offsets:
        """Turn earliest/latest/JSON/timestamps into offsets for exactly the given partitions."""
        if isinstance(spec, str):
            return self.list_offsets(tps, spec)
        if isinstance(spec, ByTimestamp):
            return self._by_timestamp(spec, tps)
        _check_named(spec, tps, option, json.dumps(offsets_to_json(spec)))
        earliest = self.list_offsets([tp for tp in tps if spec[tp] == EARLIEST], "earliest")
        latest = self.list_offsets([tp for tp in tps if spec[tp] == LATEST], "latest")
        return {tp: earliest.get(tp, latest.get(tp, spec[tp])) for tp in tps}

    def _by_timestamp(self, spec: ByTimestamp, tps: Sequence[PartitionKey]) -> Offsets:
        if isinstance(spec.at, dict):
            _check_named(spec.at, tps, spec.option, spec.raw)
        found = self.offsets_at({tp: spec.time_of(tp) for tp in tps})
        past = sorted(tp for tp, offset in found.items() if offset < 0)
        if past and spec.none_found == "error":
            topic, partition = past[0]
            raise SourceOptionError(spec.option, spec.raw,
                                    f"partition {topic}[{partition}] holds no record at or after "
                                    f"{spec.time_of(past[0])}; {STRATEGY_OPTION}=latest starts "
                                    "such partitions at their end")
        latest = self.list_offsets(past, "latest")
        return {tp: latest.get(tp, found[tp]) for tp in tps}

    def scan(self, tp: PartitionKey, scan: Scan, target: int, now_ms: int) -> None:
        """Advance `scan` towards `target` until a record is not yet due or the scan limit is
        reached. Markers and aborted records move the position without being seen."""
        if self._scanner is None:
            self._scanner = range_consumer(self.options.bootstrap, self.options.client_overrides,
                                           self._errors)
        budget = self.options.gate_scan_limit
        reader = RangeReader(self._scanner, [PartitionRange(tp[0], tp[1], scan.clear_to, target)],
                             idle_s=self.options.poll_timeout_s,
                             skip_lost=not self.options.fail_on_data_loss,
                             batch=min(CONSUME_BATCH, budget), errors=self._errors)
        for chunk in reader.chunks():
            admission = gate.admit(map(_due, chunk.messages), now_ms)
            if admission.held:
                scan.clear_to = chunk.offsets[admission.count]
                scan.held_due = admission.next_due_ms
                return
            scan.clear_to = chunk.offsets[-1] + 1
            budget -= admission.count
            if budget <= 0:
                return
        scan.clear_to = max(scan.clear_to, reader.position(tp))

    def resume_points(self, tps: Sequence[PartitionKey], earliest: Mapping[PartitionKey, int],
                      latest: Mapping[PartitionKey, int]) -> Offsets:
        """Where each partition goes on from: where redrive.group stands on it, when that lies
        within the partition, else its earliest offset."""
        stood = self.group_offsets(tps)
        for tp, offset in stood.items():
            if offset < earliest[tp]:  # records the group had not read were deleted
                self.data_loss(tp, offset, earliest[tp], latest[tp])
        return {tp: stood[tp] if tp in stood and earliest[tp] <= stood[tp] <= latest[tp]
                else earliest[tp] for tp in tps}

    def data_loss(self, tp: PartitionKey, offset: int, earliest: int, latest: int) -> None:
        """Records the query had to read from `offset` on are gone: fail, or with
        failOnDataLoss=false say so and go on."""
        why = (f"the next offset to read is {offset} but the partition now holds "
               f"[{earliest}, {latest})")
        if self.options.fail_on_data_loss:
            raise DataLoss(tp[0], tp[1], why)
        log.warning("data loss on %s[%d]: %s; reading goes on from offset %d, the "
                    "partition's earliest", tp[0], tp[1], why, earliest)

    def group_offsets(self, tps: Sequence[PartitionKey]) -> Offsets:
        """Where redrive.group stands on these partitions (those it committed on)."""
        group = self.options.group
        if group is None or not tps:
            return {}
        try:
            if self._committer is None:
                self._committer = self.options.consumer(group)
            found = self._committer.committed([TopicPartition(t, p) for t, p in tps],
                                              timeout=30)
        except KafkaException as exc:
            raise BrokerUnavailable(self.options.bootstrap,
                                    f"reading group {group!r}'s offsets failed: "
                                    f"{exc.args[0]}") from exc
        return {(str(tp.topic), int(tp.partition)): int(tp.offset) for tp in found
                if tp.offset >= 0}

    def commit_group(self, offsets: Offsets) -> bool:
        """Mirror the query's progress into redrive.group so lag tools see it. The checkpoint
        stays the source of truth, so a failed commit is reported and not fatal."""
        group = self.options.group
        if group is None or not offsets:
            return False
        try:
            if self._committer is None:
                self._committer = self.options.consumer(group)
            self._committer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in
                                            _ordered(offsets)], asynchronous=False)
        except KafkaException as exc:
            log.warning("committing offsets to group %r failed: %s", group, exc.args[0])
            return False
        return True
