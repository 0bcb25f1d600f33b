"""produce_confirmed when librdkafka fails the producer while serving its delivery reports."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive.errors import DeliveryFailed
from redrive.kafka import OutRecord
from redrive.kafka.produce import produce_confirmed, producer_failed


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
