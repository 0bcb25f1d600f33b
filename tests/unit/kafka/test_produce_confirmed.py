"""produce_confirmed when librdkafka fails the producer while serving its delivery reports, and
when its queue stays full because no broker answers."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive import kafka
from redrive.errors import DeliveryFailed
from redrive.kafka import OutRecord
from redrive.kafka.produce import produce_acked, produce_confirmed, produce_each, producer_failed


class FailingFlush:
    """A producer whose flush raises what confluent-kafka raised after a noida-db restart."""

    def __init__(self, cause: BaseException | None) -> None:
        self.cause = cause
        self.produced = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.produced += 1

    def flush(self, timeout_s: float) -> int:
        if self.cause is None:
            raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL "
                              "without setting an exception")
        raise SystemError("<class 'DeliveryFailed'> returned a result with an exception set") \
            from self.cause


def test_a_fatal_error_raised_as_a_system_error_is_a_fatal_delivery_failure() -> None:
    fatal = KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync",
                                      fatal=True))
    producer = FailingFlush(fatal)
    with pytest.raises(DeliveryFailed, match=r"delivery to orders\.delay\.1s failed: the producer "
                                             r"failed for good") as raised:
        produce_confirmed(producer, [OutRecord("orders.delay.1s", b"1"),  # type: ignore[arg-type]
                                     OutRecord("orders.delay.1s", b"2")])
    assert raised.value.fatal and producer_failed(raised.value)
    assert producer.produced == 2


def test_a_system_error_that_says_nothing_is_a_fatal_delivery_failure_too() -> None:
    """Seen once in CI after a noida-db SIGKILL and restart: the delay service ended run()."""
    with pytest.raises(DeliveryFailed, match="returned NULL without setting an exception") \
            as raised:
        produce_confirmed(FailingFlush(None), [OutRecord("t", b"1")])  # type: ignore[arg-type]
    assert raised.value.fatal and producer_failed(raised.value)


def test_any_other_system_error_is_raised_as_it_is() -> None:
    with pytest.raises(SystemError):
        produce_confirmed(FailingFlush(ValueError("a bug")),  # type: ignore[arg-type]
                          [OutRecord("t", b"1")])


@pytest.mark.parametrize("produce_all", [produce_confirmed, produce_acked, produce_each])
def test_a_queue_that_stays_full_fails_within_the_timeout(produce_all: Any) -> None:
    # Nothing listens there: the queue of 5 frees only as records expire, after 8 s (5 min by
    # default), which held each call that long whatever its timeout.
    producer = kafka.producer("127.0.0.1:1", overrides={"queue.buffering.max.messages": 5,
                                                         "message.timeout.ms": 8000})
    started = time.monotonic()
    with pytest.raises(DeliveryFailed, match="the producer's queue stayed full for 1s") as caught:
        produce_all(producer, [OutRecord("t", b"v%d" % i) for i in range(12)], timeout_s=1.0)
    assert caught.value.unanswered
    assert time.monotonic() - started < 4
    producer.purge()
    producer.flush(0)  # serves the purged records' reports: no warning at exit
