"""The source's executor side: each Spark task reads exactly `[start, end)` of one partition as
Arrow batches, with one of three readers (`redrive.reader`):

- `fetch`: redrive._fetchread (C, beside this module) speaks Kafka's fetch protocol itself and
  parses record batches in place into Arrow buffers; what it does not handle (a compressed or
  old-format batch, a partition error, a broker it cannot reach) it hands to the next reader at
  the offset it reached;
- `native`: redrive._rangeread (C over librdkafka): every librdkafka setting and codec;
- `python`: the same loop through confluent-kafka and `redrive.kafka.ranges`.

All three follow the rules of `redrive.kafka.ranges` (the end of a range, retention gaps and
failOnDataLoss, no progress for kafkaConsumer.pollTimeoutMs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from redrive import kafka
from redrive.gc_pause import gc_paused
from redrive.kafka.ranges import (
    RANGE_READ_DEFAULTS,
    LastClientError,
    PartitionRange,
    RangeReader,
    RangeReadFailed,
    range_consumer,
)
from redrive.spark import buffers
from redrive.spark.columns import arrow_type, with_redrive_column
from redrive.spark.options import (
    SourceOptionError,
    SourceOptions,
    fetch_reader_built,
    kafka_schema,
    native_reader_built,
)

if TYPE_CHECKING:
    from redrive.spark._rangeread import RangeReader as NativeReader

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to Spark: large enough to amortise the per-batch cost, small enough
# to keep an executor's memory flat; a batch of large records ends earlier, at about
# ARROW_BATCH_BYTES of keys and values (which also keeps binary offsets within int32).
ARROW_BATCH_ROWS = 20_000
ARROW_BATCH_BYTES = 64 << 20


@dataclass(frozen=True)
class KafkaRange(PartitionRange, InputPartition):
    """One Spark task: offsets [start, end) of one Kafka partition."""


def _size(items: list[bytes | None]) -> int:
    """Bytes held by `items`, None counting as nothing."""
    try:
        return sum(map(len, cast("list[bytes]", items)))
    except TypeError:
        return sum(len(item) for item in items if item is not None)


@dataclass(frozen=True)
class _Unreadable:
    """A message whose header names are not all UTF-8: its row, offset, and the one such name
    confluent-kafka's error names."""

    row: int
    offset: int
    name: bytes


def _header_lists(messages: Sequence[Message], first_row: int, offsets: Sequence[int]
                  ) -> tuple[list[Any], list[_Unreadable]]:
    """Each message's headers as confluent-kafka gives them (None for none), and the messages
    whose headers it cannot read, with None in their place."""
    found: list[Any] = []
    unreadable: list[_Unreadable] = []
    rest = iter(messages)
    while True:
        try:
            # One C-level call per message while every name is UTF-8, through map's checked
            # call (see redrive.kafka.records._HEADERS). On a failure, extend keeps what it
            # appended and `rest` resumes after the message that failed, whose headers must
            # not be asked for again.
            found.extend(map(Message.headers, rest))
            return [pairs or None for pairs in found], unreadable
        except SystemError as exc:
            cause = exc.__cause__
            # Without the decode error's bytes, a name that shows it cannot be read.
            name = cause.object if isinstance(cause, UnicodeDecodeError) else b"\xff"
            unreadable.append(_Unreadable(first_row + len(found), offsets[len(found)],
                                          bytes(name)))
            found.append(None)


@dataclass
class _Columns:
    """Column builders for one Arrow batch; the Arrow types come from Spark's own conversion of
    the schema, so batches match what Spark expects exactly. Columns are filled a consumed batch
    at a time with map over Message's methods: per-record Python work is most of the read cost,
    so each field is fetched by one C-level call per record and nothing else."""

    topic: str
    partition: int
    include_headers: bool
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    # (type, ms) of each record, flattened: type, ms, type, ms, ...
    stamps: list[int] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)
    nbytes: int = 0

    def add(self, messages: Sequence[Message], offsets: Sequence[int]) -> list[_Unreadable]:
        """Adds the messages; returns those whose headers confluent-kafka cannot read, whose
        rows hold None in `headers` until set."""
        unreadable: list[_Unreadable] = []
        if self.include_headers:
            found, unreadable = _header_lists(messages, len(self.offsets), offsets)
            self.headers += found
        keys = list(map(Message.key, messages))
        values = list(map(Message.value, messages))
        self.keys += keys
        self.values += values
        self.offsets += offsets
        self.stamps += chain.from_iterable(map(Message.timestamp, messages))
        self.nbytes += _size(keys) + _size(values)
        return unreadable

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        n = len(self.offsets)
        # Kafka's TimestampType ids as Spark shows them (-1 none, 0 create, 1 log append) are
        # librdkafka's minus one; times are ms, Spark's are us.
        kinds = pa.array(self.stamps[0::2], pa.int32())
        millis = pa.array(self.stamps[1::2], pa.int64())
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(schema.field("timestamp").type),
            pc.subtract(kinds, 1),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, schema.field("headers").type))
        for column in (self.keys, self.values, self.offsets, self.stamps, self.headers):
            column.clear()
        self.nbytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_range(options: SourceOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Read exactly [start, end) of one partition as Arrow batches.

    The loop ends when the position reaches `end`, not when offset end-1 was seen: under
    read_committed the last offsets of a range may be transaction markers or aborted records,
    which are never delivered. Both C readers follow the same rules as the confluent-kafka loop
    below, without a Python object per record: redrive.spark._fetchread (Kafka's fetch protocol, for
    what it handles) and redrive.spark._rangeread (librdkafka, for the rest).
    """
    schema = to_arrow_schema(kafka_schema(options.include_headers), timezone="UTC")
    batches = (_read_fetch(options, part, schema) if options.fetch and _built("fetch")
               else _read_client(options, part, schema))
    if not options.decode_headers:
        return batches
    kind = arrow_type()
    return (with_redrive_column(batch, kind) for batch in batches)


def _read_client(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range through a Kafka client library: librdkafka from C, or confluent-kafka."""
    if options.native and _built("native"):
        return _read_native(options, part, schema)
    return _read_python(options, part, schema)


_BUILT: dict[str, bool] = {}


def _built(reader: str) -> bool:
    """Whether this worker has the C reader the driver chose. On a cluster the driver's machine
    may have them built and an executor's not (a wheel built without a compiler, another
    platform): the executor then reads with the next reader and says so once."""
    built = _BUILT.get(reader)
    if built is None:
        built = _BUILT[reader] = (fetch_reader_built() if reader == "fetch"
                                  else native_reader_built())
        if not built:
            log.warning("redrive-kafka: the %s reader (redrive.spark.%s) is not built on this "
                        "worker; reading with the %s reader", reader,
                        "_fetchread" if reader == "fetch" else "_rangeread",
                        "native or Python" if reader == "fetch" else "Python")
    return built


def _read_fetch(options: SourceOptions, part: KafkaRange,
                schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range through redrive.spark._fetchread, which speaks Kafka's fetch protocol itself;
    what it hands back (a compressed batch, a partition error, a broker it cannot reach) is read
    by the client library from the offset it reached, by the same rules as any other read."""
    from redrive.spark._fetchread import FetchReader, ReadError

    reader = FetchReader(options.bootstrap, part.topic, part.partition, part.start, part.end,
                         options.include_headers, options.read_committed,
                         max(1, round(options.poll_timeout_s * 1000)),
                         options.client_overrides.get("client.id", "redrive"))
    try:
        yield from buffers.batches(reader, part.topic, part.partition, schema,
                                   max_rows=ARROW_BATCH_ROWS, max_bytes=ARROW_BATCH_BYTES)
    except ReadError as exc:
        raise RangeReadFailed(part.topic, part.partition, part.start, part.end,
                              str(exc)) from None
    finally:
        reader.close()
    if reader.handoff is None or reader.position >= part.end:
        return
    log.info("%s[%d]: offsets %d to %d read by the client library: %s", part.topic,
             part.partition, reader.position, part.end - 1, reader.handoff)
    yield from _read_client(options, KafkaRange(part.topic, part.partition, reader.position,
                                                part.end), schema)


def _read_native(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    from redrive.spark._rangeread import ReadError, librdkafka_version

    try:
        try:
            reader = _native_reader(options, part)
        except ValueError as exc:
            # The system's librdkafka may be older than confluent-kafka's own.
            raise SourceOptionError("kafka.*", str(exc), (
                f"rejected by librdkafka {librdkafka_version()}, which the native reader "
                "links; redrive.reader=python reads through confluent-kafka")) from None
        try:
            yield from buffers.batches(reader, part.topic, part.partition, schema,
                                       max_rows=ARROW_BATCH_ROWS, max_bytes=ARROW_BATCH_BYTES)
        finally:
            reader.close()
    except ReadError as exc:
        raise RangeReadFailed(part.topic, part.partition, part.start, part.end,
                              str(exc)) from None


def _read_python(options: SourceOptions, part: KafkaRange,
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    errors = LastClientError()
    consumer = range_consumer(options.bootstrap, options.client_overrides, errors)
    try:
        chunks = RangeReader(consumer, [part], idle_s=options.poll_timeout_s,
                             skip_lost=not options.fail_on_data_loss, errors=errors).chunks()
        columns = _Columns(part.topic, part.partition, options.include_headers)
        while True:
            with gc_paused():
                chunk = next(chunks, None)
                if chunk is not None:
                    for record in columns.add(chunk.messages, chunk.offsets):
                        columns.headers[record.row] = _headers_read_again(options, part,
                                                                          record, schema)
                full = (len(columns) >= ARROW_BATCH_ROWS
                        or columns.nbytes >= ARROW_BATCH_BYTES)
                ready = columns.batch(schema) if full or (chunk is None and len(columns)) \
                    else None
            if ready is not None:
                yield ready
            if chunk is None:
                return
    finally:
        consumer.close()


def _headers_read_again(options: SourceOptions, part: KafkaRange, record: _Unreadable,
                        schema: pa.Schema) -> list[Any]:
    """The headers of a record whose names confluent-kafka cannot decode, as the other readers
    show them (invalid UTF-8 as U+FFFD), read again by the librdkafka reader: confluent-kafka
    keeps no bytes of them once its decode failed. Where that reader is not built or cannot
    read the broker, only the name its error gave is known, and the row holds that name alone."""
    if native_reader_built():
        try:
            one = KafkaRange(part.topic, part.partition, record.offset, record.offset + 1)
            batches = list(_read_native(options, one, schema))
            if batches and batches[0].num_rows:
                # As tuples, like the other rows' pairs: Arrow takes one form per column.
                return [(pair["key"], pair["value"])
                        for pair in batches[0].column("headers")[0].as_py() or ()]
        except (RangeReadFailed, SourceOptionError) as exc:
            log.warning("%s[%d]: offset %d: reading its headers with librdkafka failed: %s",
                        part.topic, part.partition, record.offset, exc)
    log.warning("%s[%d]: offset %d has a header name that is not UTF-8, which confluent-kafka "
                "cannot read; its headers are shown as that one name, without a value",
                part.topic, part.partition, record.offset)
    return [(record.name.decode("utf-8", "replace"), None)]


def _native_reader(options: SourceOptions, part: KafkaRange) -> NativeReader:
    """redrive._rangeread's reader of the range, set up as an assign-only range consumer;
    raises ValueError naming a setting librdkafka rejects."""
    from redrive.spark._rangeread import RangeReader as NativeReader

    config = kafka.consumer_config(options.bootstrap, None,
                                   {**options.client_overrides, **RANGE_READ_DEFAULTS})
    settings: list[tuple[str, str]] = []
    for name, value in config.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        settings.append((name, text))
    return NativeReader(settings, part.topic, part.partition, part.start, part.end,
                        options.include_headers, max(1, round(options.poll_timeout_s * 1000)),
                        not options.fail_on_data_loss)
