"""The producers a Python process keeps between Spark tasks: one that failed for good is not kept,
one left unused is closed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive import kafka
from redrive.spark import producers

NOWHERE = "127.0.0.1:9"  # a producer is made without connecting


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    producers.drop_cached_producers()
    yield
    producers.drop_cached_producers()


def failing(code: int) -> Any:
    def produce_acked(*args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(code, "as librdkafka reports it"))
    return produce_acked


def test_a_producer_failed_for_good_is_forgotten_so_the_next_attempt_makes_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = producers.cached_producer(NOWHERE)
    other = producers.cached_producer(NOWHERE, {"linger.ms": 1})
    monkeypatch.setattr(kafka, "produce_acked",
                        failing(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER))
    with pytest.raises(KafkaException, match="as librdkafka reports it"):
        producers.produce_cached(NOWHERE, [], 1.0)
    assert producers.cached_producer(NOWHERE) is not first
    assert producers.cached_producer(NOWHERE, {"linger.ms": 1}) is other  # not the one that failed


def test_a_producer_that_only_timed_out_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    first = producers.cached_producer(NOWHERE)
    monkeypatch.setattr(kafka, "produce_acked", failing(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaException):
        producers.produce_cached(NOWHERE, [], 1.0)
    assert producers.cached_producer(NOWHERE) is first


def test_a_producer_left_unused_is_closed_and_the_next_use_makes_a_new_one() -> None:
    first = producers.cached_producer(NOWHERE)
    used = time.monotonic()  # at or after its first use
    assert producers.close_idle(used + producers.IDLE_CLOSE_S - 1) == 0
    time.sleep(0.05)
    assert producers.cached_producer(NOWHERE) is first
    # idle for IDLE_CLOSE_S since the first use, not since the second: kept
    assert producers.close_idle(used + producers.IDLE_CLOSE_S + 0.01) == 0
    assert producers.close_idle(time.monotonic() + producers.IDLE_CLOSE_S) == 1
    assert producers.cached_producer(NOWHERE) is not first


def test_a_producer_waiting_for_acknowledgements_is_not_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the wait (a task's timeout may pass IDLE_CLOSE_S): closed under it, its
    records would be purged and the task would fail."""
    seen: list[int] = []

    def waits(producer: Any, records: Any, timeout_s: float, **kwargs: Any) -> int:
        seen.append(producers.close_idle(time.monotonic() + producers.IDLE_CLOSE_S))
        return 0

    monkeypatch.setattr(kafka, "produce_acked", waits)
    producers.produce_cached(NOWHERE, [], 1.0)
    assert seen == [0]
    assert producers.close_idle(time.monotonic() + producers.IDLE_CLOSE_S - 1) == 0
    assert producers.close_idle(time.monotonic() + producers.IDLE_CLOSE_S) == 1


def test_the_process_closes_idle_producers_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a thread of its own, a Spark worker whose queries stopped would keep them for
    good, connected (or reconnecting) to their brokers."""
    monkeypatch.setattr(producers, "IDLE_CLOSE_S", 0.2)
    monkeypatch.setattr(producers, "SWEEP_EVERY_S", 0.05)
    monkeypatch.setattr(producers, "_sweeper", None)  # one started earlier sleeps 15 s
    producers.cached_producer(NOWHERE)
    producers.cached_producer(NOWHERE, {"linger.ms": 1})
    deadline = time.monotonic() + 5
    while len(producers._PRODUCERS) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(producers._PRODUCERS) == 0
