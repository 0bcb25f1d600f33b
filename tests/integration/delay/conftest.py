"""Helpers for the delay-service tests: short tiers, a service in a thread, a target reader."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer, TopicPartition

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.delay import DelayService, Tiers

# Short tiers keep the suite fast; the smallest is the documented lateness bound.
TEST_TIERS = ("100ms", "1s", "5s")
# The service's own latency on top of the smallest tier (poll, transaction, fetch), with room
# for a loaded 2-core test machine running three test workers. The bound it gives (the 100 ms
# tier plus this) stays under half the next tier (1 s), and the doubled allowance of the test
# with two services in one interpreter (900 ms) under that tier, so a record forwarded a tier
# late fails.
SERVICE_LATENCY_MS = 400


@pytest.fixture
def tiers(unique_name: Callable[..., str]) -> Tiers:
    return Tiers.of(TEST_TIERS, prefix=f"{unique_name('delay')}.delay")



def warm_producer(bootstrap: str, scratch_topic: str) -> Producer:
    """A producer past its start-up (its first flush takes up to a second on noida-db), so that
    records are written when schedule() stamps them, and lateness is the service's."""
    producer = kafka.producer(bootstrap)
    kafka.produce_confirmed(producer, [kafka.OutRecord(scratch_topic, b"warm-up")])
    return producer


@contextmanager
def running(service: DelayService, timeout_s: float = 30.0) -> Iterator[DelayService]:
    """Run the service in a thread until the block ends; wait until it owns partitions."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:
            failure.append(exc)
            raise

    thread = threading.Thread(target=run, name="delay-service", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while service.metrics.value("redrive_rebalances_total", kind="assign") < 1:
        assert thread.is_alive(), f"the service stopped: {failure}"
        assert time.monotonic() < deadline, "the service got no partitions"
        time.sleep(0.05)
    try:
        yield service
    finally:
        service.stop()
        thread.join(30)
        assert not thread.is_alive(), "the service did not stop within 30 s of stop()"
    assert not failure, failure


@dataclass(frozen=True)
class Arrival:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp_ms: int
    seen_ms: int

    def header(self, name: str) -> str | None:
        raw = h.last(self.headers, name)
        return None if raw is None else raw.decode()

    @property
    def due_ms(self) -> int:
        return int(self.header(h.DUE) or -1)


class Reader:
    """Reads topics from the start with read_committed, noting when each record was seen."""

    def __init__(self, bootstrap: str, *topics: str) -> None:
        admin = kafka.admin(bootstrap)
        self.consumer = kafka.consumer(bootstrap, overrides={"fetch.wait.max.ms": 10})
        self.consumer.assign([TopicPartition(topic, p, 0) for topic in topics
                              for p in range(kafka.partition_count(admin, topic))])
        self.arrivals: list[Arrival] = []

    def read(self, expect: int, timeout_s: float, idle_s: float = 0.5) -> list[Arrival]:
        """Read until `expect` records arrived and nothing more came for `idle_s`."""
        deadline = time.monotonic() + timeout_s
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            for message in self.consumer.consume(1000, 0.05):
                if message.error() is not None:
                    continue
                self.arrivals.append(Arrival(
                    str(message.topic()), message.key(), message.value(),
                    kafka.message_headers(message), int(message.timestamp()[1]), now_ms()))
                last_new = time.monotonic()
            if len(self.arrivals) >= expect and time.monotonic() - last_new >= idle_s:
                return self.arrivals
        raise AssertionError(f"expected {expect} records, read {len(self.arrivals)} in "
                             f"{timeout_s}s")

    def close(self) -> None:
        self.consumer.close()
