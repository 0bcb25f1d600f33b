"""`redrive-kafka`: a PySpark data source for Kafka with the schema and options of Spark's own.

It reads like `spark.readStream.format("kafka")` (same columns, same option names where they
apply; see `options`) and adds the due gate: a planned micro-batch ends before the first record
whose `redrive-due` lies in the future, so no record reaches the query before its due time. The
driver plans (`planning`), executors read (`readers`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from redrive.clock import now_ms
from redrive.errors import BrokerUnavailable
from redrive.kafka.records import PartitionKey
from redrive.spark.options import (
    EARLIEST,
    LATEST,
    ByTimestamp,
    OffsetsSpec,
    SourceOptionError,
    SourceOptions,
    kafka_schema,
)
from redrive.spark.planning import (
    Broker,
    Offsets,
    Scan,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from redrive.spark.readers import KafkaRange, read_range

log = logging.getLogger(__name__)

SOURCE_NAME = "redrive-kafka"
# How long micro-batch planning waits for brokers that do not answer before the query fails.
OUTAGE_WAIT_S = 120.0
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0


def planned_ranges(start: Mapping[PartitionKey, int],
                   end: Mapping[PartitionKey, int]) -> list[KafkaRange]:
    """One task per partition with records between `start` and `end` (none where the end lies
    below the start: a partition restarted at its earliest offset)."""
    return [KafkaRange(t, p, start[(t, p)], stop) for (t, p), stop in sorted(end.items())
            if (t, p) in start and stop > start[(t, p)]]


def check_bounds(start: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int],
                 latest: Mapping[PartitionKey, int], options: SourceOptions) -> None:
    """Offsets a batch read was given must lie within each partition, the start before the end:
    an end past the partition's end would wait for records that never come (then fail as a
    stuck read), and a start past the end would read nothing without a word."""
    for tp in sorted(end):
        topic, partition = tp
        if end[tp] > latest[tp]:
            raise SourceOptionError(*_given("endingOffsets", options.ending),
                                    f"partition {topic}[{partition}] ends at offset {latest[tp]};"
                                    f" {end[tp]} is past it")
        if start[tp] > end[tp]:
            # Name the option the user gave: an end before the partition's first offset when
            # only endingOffsets was given.
            option, given = (_given("startingOffsets", options.starting)
                             if explicit(options.starting)
                             else _given("endingOffsets", options.ending))
            raise SourceOptionError(option, given,
                                    f"partition {topic}[{partition}] would start at offset "
                                    f"{start[tp]}, after its ending offset {end[tp]}")


def explicit(spec: OffsetsSpec | None) -> bool:
    """Whether offsets were given per partition or by time, rather than earliest or latest."""
    return isinstance(spec, (dict, ByTimestamp))


def resumed_starts(broker: Broker, tps: Sequence[PartitionKey]) -> Offsets:
    """Where the resumed topics' partitions start: where redrive.group stands, else at their
    earliest offset. They hold the group's own unfinished retry copies, which a new checkpoint
    started at latest would skip, and one at earliest would handle again."""
    resumed = [tp for tp in tps if tp[0] in broker.options.resume_topics]
    if not resumed:
        return {}
    return broker.resume_points(resumed, broker.list_offsets(resumed, "earliest"),
                                broker.list_offsets(resumed, "latest"))


def _given(name: str, spec: OffsetsSpec | None) -> tuple[str, object]:
    """An offsets option as the user named and wrote it: JSON for offsets per partition."""
    if isinstance(spec, ByTimestamp):
        return spec.option, spec.raw
    return name, json.dumps(offsets_to_json(spec)) if isinstance(spec, dict) else spec


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, KafkaRange):
        return read_range(options, partition)
    if type(partition) is InputPartition and partition.value is None:
        # When nothing is planned (an empty topic) Spark still runs one task with a bare
        # partition: it reads nothing.
        return iter(())
    raise TypeError(f"redrive-kafka cannot read {partition!r}: not a KafkaRange")


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    expected = kafka_schema(options.include_headers, options.decode_headers)
    if schema != expected:
        raise SourceOptionError("schema", schema.simpleString(),
                                f"redrive-kafka has a fixed schema: {expected.simpleString()}")


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (with the due gate) and reads them on executors."""

    def __init__(self, options: SourceOptions) -> None:
        if options.ending is not None:
            option, given = _given("endingOffsets", options.ending)
            raise SourceOptionError(option, given, f"only batch queries accept {option}")
        self.options = options
        self._broker: Broker | None = None
        self._scans: dict[PartitionKey, Scan] = {}
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        self._committed: Offsets | None = None
        self._initial: dict[str, dict[str, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy for read(): clients and planning state stay on the driver.
        return {"options": self.options, "_broker": None, "_scans": {}, "_target": None,
                "_latest": None, "_committed": None, "_initial": None}

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = Broker(self.options)
        return self._broker

    def initialOffset(self) -> dict[str, dict[str, int]]:
        # Spark asks again when it runs the first batch; "latest" must not move in between, or
        # the records produced meanwhile would fall outside both batches.
        if self._initial is None:
            tps = self.broker.partitions(require_all=True)
            resumed = self._resumed(tps)
            # startingOffsets (or its timestamp forms) name the other topics' partitions only.
            start = self.broker.resolve(self.options.starting or "latest",
                                        [tp for tp in tps if tp not in resumed],
                                        "startingOffsets")
            start.update(resumed)
            if isinstance(self.options.starting, dict) and self.options.fail_on_data_loss:
                self._check_start(start)
            self._initial = offsets_to_json(start)
        return self._initial

    def _check_start(self, start: Offsets) -> None:
        """Offsets given per partition lie within it, else the error names the option (with
        failOnDataLoss=false, planning warns and goes on from the partition's earliest)."""
        given = [tp for tp in start if tp[0] not in self.options.resume_topics]
        earliest = self.broker.list_offsets(given, "earliest")
        latest = self.broker.list_offsets(given, "latest")
        for tp in sorted(given):
            if not earliest[tp] <= start[tp] <= latest[tp]:
                raise SourceOptionError(*_given("startingOffsets", self.options.starting),
                                        f"partition {tp[0]}[{tp[1]}] holds offsets "
                                        f"[{earliest[tp]}, {latest[tp]}); {start[tp]} is "
                                        "outside them (failOnDataLoss=false starts such "
                                        "partitions at their earliest offset)")

    def _resumed(self, tps: Sequence[PartitionKey]) -> Offsets:
        return resumed_starts(self.broker, tps)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.broker.partitions(require_all=True)
        self._target = self.broker.list_offsets(tps, "latest")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The next batch's end. Through a broker outage planning waits, asking again at
        growing intervals, for up to OUTAGE_WAIT_S before the query fails with the error:
        nothing can be read meanwhile, and a short outage need not stop the query."""
        waited, pause = 0.0, FIRST_RETRY_S
        while True:
            try:
                return self._latest_offset(start, limit)
            except BrokerUnavailable as exc:
                if waited >= OUTAGE_WAIT_S:
                    raise
                if waited == 0:
                    log.warning("%s; planning waits up to %.0fs for the brokers", exc,
                                OUTAGE_WAIT_S)
                time.sleep(pause)
                waited += pause
                pause = min(pause * 2, MAX_RETRY_S)

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = offsets_from_json(start)
        # Spark plans the next batch only once the previous one is done, so `start` is
        # processed. It calls commit(end) only when planning the batch after that, which never
        # comes for the last batch of an availableNow run or before a stop.
        self._commit_group(begin)
        broker = self.broker
        tps = broker.partitions(require_all=False)
        latest = broker.list_offsets(tps, "latest")
        earliest = broker.list_offsets(tps, "earliest")
        self._latest = latest
        subscribed = set(self.options.topics)
        end: Offsets = {tp: offset for tp, offset in begin.items()
                        if tp[0] in subscribed and tp not in latest}
        # A partition that appeared since the last batch enters the offsets first, so every
        # batch's start is a recorded value and replays read the same: where redrive.group
        # stands on it (a topic back in the subscription, whose offsets the checkpoint dropped:
        # a retry topic of a policy brought back), else at its earliest offset.
        end.update(broker.resume_points([tp for tp in tps if tp not in begin], earliest, latest))
        known = {tp: begin[tp] for tp in tps if tp in begin}
        ceiling: Offsets = {}
        for tp, offset in known.items():
            top = latest[tp]
            if top < offset or offset < earliest[tp]:
                broker.data_loss(tp, offset, earliest[tp], latest[tp])
            if top < offset:
                # The partition was recreated or truncated: holding the old offset would skip
                # every record it gets below it. An empty batch ending at its earliest offset
                # makes the next one start there. (Below its earliest, the readers skip the
                # deleted records and go on from there in this batch.)
                ceiling[tp] = earliest[tp]
                # What the gate found due was of the records before: the new ones are scanned.
                self._scans.pop(tp, None)
                continue
            if self._target is not None:
                # An availableNow run stops where the partitions ended when it was prepared. A
                # start past that (`latest` resolved later, records written meanwhile) has
                # nothing left to read, and nothing was lost.
                top = min(top, self._target.get(tp, offset))
            ceiling[tp] = max(top, offset)
        if isinstance(limit, ReadMaxRows):
            ceiling = rate_limit(known, ceiling, limit.max_rows)
        now = now_ms()
        for tp, offset in known.items():
            stop = ceiling[tp]
            if stop > offset and self.options.gated(tp[0]):
                stop = self._gate(tp, offset, stop, now)
            end[tp] = stop
        return offsets_to_json(end)

    def _gate(self, tp: PartitionKey, begin: int, stop: int, now_ms: int) -> int:
        scan = self._scans.get(tp)
        if scan is None or not scan.start <= begin <= scan.clear_to:
            scan = Scan(begin, begin)
        scan.start = begin
        self._scans[tp] = scan
        if scan.held_due is not None:
            if scan.held_due > now_ms:
                return min(scan.clear_to, stop)
            scan.clear_to += 1
            scan.held_due = None
        if scan.clear_to < stop:
            self.broker.scan(tp, scan, stop, now_ms)
        return min(scan.clear_to, stop)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        return planned_ranges(offsets_from_json(start), offsets_from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(offsets_from_json(end))

    def _commit_group(self, offsets: Offsets) -> None:
        if self.options.group is None or offsets == self._committed:
            return
        if self.broker.commit_group(offsets):
            self._committed = dict(offsets)

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None


class KafkaBatchReader(DataSourceReader):
    """Reads [startingOffsets, endingOffsets) once, without the gate."""

    def __init__(self, options: SourceOptions) -> None:
        if options.starting == "latest" or (isinstance(options.starting, dict)
                                            and LATEST in options.starting.values()):
            raise SourceOptionError(*_given("startingOffsets", options.starting),
                                    "a batch query cannot start at latest")
        if options.ending == "earliest" or (isinstance(options.ending, dict)
                                            and EARLIEST in options.ending.values()):
            raise SourceOptionError(*_given("endingOffsets", options.ending),
                                    "a batch query cannot end at earliest")
        self.options = options

    def partitions(self) -> list[KafkaRange]:
        broker = Broker(self.options)
        try:
            tps = broker.partitions(require_all=True)
            # As in a stream: startingOffsets (or its timestamp forms) name the other topics.
            resumed = resumed_starts(broker, tps)
            start = broker.resolve(self.options.starting or "earliest",
                                   [tp for tp in tps if tp not in resumed], "startingOffsets")
            start.update(resumed)
            end = broker.resolve(self.options.ending or "latest", tps, "endingOffsets")
            if explicit(self.options.starting) or explicit(self.options.ending):
                check_bounds(start, end, broker.list_offsets(tps, "latest"), self.options)
        finally:
            broker.close()
        return planned_ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class RedriveKafkaSource(DataSource):
    """`spark.readStream.format("redrive-kafka")`: Spark's Kafka source plus the due gate."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _options(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def schema(self) -> StructType:
        options = self._options()
        return kafka_schema(options.include_headers, options.decode_headers)

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        options = self._options()
        _check_schema(schema, options)
        return KafkaStreamReader(options)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        options = self._options()
        _check_schema(schema, options)
        return KafkaBatchReader(options)


def register(spark: Any) -> None:
    """Make `format("redrive-kafka")` available in this SparkSession."""
    spark.dataSource.register(RedriveKafkaSource)
