"""The producers a Spark worker keeps between tasks: one that failed for good is not kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive import kafka
from redrive.spark import writer

NOWHERE = "127.0.0.1:9"  # a producer is made without connecting


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    writer.drop_cached_producers()
    yield
    writer.drop_cached_producers()


def failing(code: int) -> Any:
    def produce_acked(*args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(code, "as librdkafka reports it"))
    return produce_acked


def test_a_producer_failed_for_good_is_forgotten_so_the_next_attempt_makes_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = writer.cached_producer(NOWHERE)
    other = writer.cached_producer(NOWHERE, {"linger.ms": 1})
    monkeypatch.setattr(kafka, "produce_acked",
                        failing(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER))
    with pytest.raises(KafkaException, match="as librdkafka reports it"):
        writer.produce_cached(NOWHERE, [], 1.0)
    assert writer.cached_producer(NOWHERE) is not first
    assert writer.cached_producer(NOWHERE, {"linger.ms": 1}) is other  # not the one that failed


def test_a_producer_that_only_timed_out_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    first = writer.cached_producer(NOWHERE)
    monkeypatch.setattr(kafka, "produce_acked", failing(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaException):
        writer.produce_cached(NOWHERE, [], 1.0)
    assert writer.cached_producer(NOWHERE) is first
