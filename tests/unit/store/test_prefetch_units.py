"""The consumer's pre-pass for a backend's prefetch, driven with fake clients: which records of a
batch it hands over, that it does so before their admit calls, and that a backend without a
prefetch of its own never costs one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError

from redrive import headers as h
from redrive import kafka
from redrive.backends import BoundBackend, RetryBackend, Verdict
from redrive.consumer import RetryingConsumer
from redrive.consumer import runtime as consumer_runtime
from redrive.consumer.committer import Committer
from redrive.policy import RetryPolicy
from redrive.record import Record
from redrive.routing import Route

from ..fakes import FakeMessage

GROUP, TOPIC = "g", "orders"


def message(offset: int, headers: list[tuple[str, bytes]] | None = None,
            error: object = None) -> FakeMessage:
    return FakeMessage(TOPIC, 0, offset, b"v%d" % offset, headers, b"k", error)


def copy_of(group: str, offset: int) -> list[tuple[str, bytes]]:
    return [(h.GROUP, group.encode()), (h.ATTEMPT, b"1"), (h.ORIGINAL_TOPIC, TOPIC.encode()),
            (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"%d" % offset)]


BATCH = [
    message(0),  # no headers
    message(1, [("trace-id", b"t")]),  # headers, none of redrive's
    message(2, copy_of(GROUP, 0)),  # this group's copy
    message(3, copy_of("other", 0)),  # another group's: skipped, never admitted
    message(4, [(h.ATTEMPT, b"many")]),  # malformed: routed, never admitted
    message(5, [(h.ATTEMPT, b"2")]),  # history without a group
    message(6, error=KafkaError(KafkaError._PARTITION_EOF, "partition EOF")),
]


class Recording(BoundBackend):
    def __init__(self, calls: list[tuple[str, list[int]]], sequential: bool) -> None:
        self.calls = calls
        self.sequential = sequential

    def prefetch(self, records: Sequence[Record]) -> None:
        self.calls.append(("prefetch", [r.offset for r in records]))

    def admit(self, record: Record) -> Verdict:
        self.calls.append(("admit", [record.offset]))
        return Verdict.PROCESS

    def failed(self, record: Record, decision: Route,
               partitions: Mapping[str, int]) -> kafka.OutRecord | None:
        return None


class WithoutPrefetch(Recording):
    prefetch = BoundBackend.prefetch


class Backend(RetryBackend):
    def __init__(self, bound: BoundBackend) -> None:
        self.bound = bound

    def bind(self, group: str) -> BoundBackend:
        return self.bound


class FakeConsumer:
    def commit(self, offsets: list[Any], asynchronous: bool) -> list[Any]:
        return offsets


def handle(bound: BoundBackend) -> None:
    runtime = RetryingConsumer("localhost:9", TOPIC, GROUP, RetryPolicy(), lambda record: None,
                               retry_backend=Backend(bound))
    consumer: Any = FakeConsumer()
    runtime._consumer = consumer
    runtime._committer = Committer(GROUP, consumer, runtime._backend, runtime.metrics,
                                   runtime._assigned, 30.0, runtime.health)
    runtime._assigned.add((TOPIC, 0))
    runtime._handle_batch(BATCH)  # type: ignore[arg-type]


@pytest.mark.parametrize(("sequential", "prefetched"), [(False, [2, 5]),
                                                        (True, [0, 1, 2, 5])])
def test_the_records_to_admit_are_prefetched_first_and_once(sequential: bool,
                                                            prefetched: list[int]) -> None:
    calls: list[tuple[str, list[int]]] = []
    handle(Recording(calls, sequential))
    assert calls == [("prefetch", prefetched), *(("admit", [o]) for o in (0, 1, 2, 5))]


def test_a_backend_without_a_prefetch_pays_for_no_pre_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[int]]] = []
    monkeypatch.setattr(consumer_runtime, "records_to_admit", lambda *args: pytest.fail(
        "the batch was gone over for a backend that does not prefetch"))
    handle(WithoutPrefetch(calls, sequential=True))
    assert calls == [("admit", [o]) for o in (0, 1, 2, 5)]
