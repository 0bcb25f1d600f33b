"""Helpers for the RetryingConsumer tests: produce, read back, run a consumer in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from redrive import headers as h
from redrive import kafka
from redrive.record import Record

from ..background import Running
from ..records import produce_input

__all__ = ["Running"]

# Small but legal everywhere: noida-db refuses session.timeout.ms below 6000.
FAST_GROUP: Mapping[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def produce(bootstrap: str, topic: str, values: Iterable[bytes], *, partition: int | None = None,
            headers: Sequence[tuple[str, bytes]] = (), key: bytes | None = None) -> None:
    produce_input(bootstrap, [kafka.OutRecord(topic, value, key, headers, partition)
                              for value in values])


@dataclass(frozen=True)
class Read:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str | None:
        raw = h.last(self.headers, name)
        return None if raw is None else raw.decode()


def read_all(bootstrap: str, topic: str, *, expect: int | None = None,
             timeout_s: float = 10.0, idle_s: float = 0.5,
             isolation: str = "read_committed") -> list[Read]:
    """Every record of a topic, read from the start (committed ones unless `isolation` says
    "read_uncommitted").

    Returns once `expect` records arrived (then waits `idle_s` more to catch extras), or, without
    `expect`, after `idle_s` with nothing new; fails if `expect` is not reached in time.
    """
    admin = kafka.admin(bootstrap)
    partitions = kafka.partition_count(admin, topic)
    consumer = kafka.consumer(bootstrap, overrides={"isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Read] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.1):
                if message.error() is not None:
                    continue
                out.append(Read(str(message.topic()), int(message.partition() or 0),
                                int(message.offset() or 0), message.key(), message.value(),
                                kafka.message_headers(message)))
                last_new = time.monotonic()
            quiet = time.monotonic() - last_new >= idle_s
            if expect is None and quiet:
                return out
            if expect is not None and len(out) >= expect and quiet:
                return out
    finally:
        consumer.close()
    if expect is not None:
        raise AssertionError(f"{topic}: expected {expect} records, read {len(out)} in "
                             f"{timeout_s}s")
    return out


def topic_size(bootstrap: str, topic: str) -> int:
    """Records written to a topic so far (high watermarks summed; 0 if it does not exist yet)."""
    admin = kafka.admin(bootstrap)
    partitions = kafka.topic_partitions(admin).get(topic, 0)
    consumer = kafka.consumer(bootstrap)
    try:
        return sum(kafka.watermarks(consumer, topic, p)[1] for p in range(partitions))
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of a topic (-1001 when none)."""
    partitions = kafka.partition_count(kafka.admin(bootstrap), topic)
    consumer = kafka.consumer(bootstrap, group)
    try:
        result = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                    timeout=10)
    finally:
        consumer.close()
    return {int(tp.partition): int(tp.offset) for tp in result}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class Handled:
    """What a test handler saw: each call with the local time it started."""

    calls: list[tuple[Record, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: Record) -> None:
        with self.lock:
            self.calls.append((record, time.time_ns() // 1_000_000))

    def values(self) -> list[bytes | None]:
        with self.lock:
            return [record.value for record, _ in self.calls]

    def count(self, value: bytes) -> int:
        return self.values().count(value)


