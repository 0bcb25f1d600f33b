"""Closing a producer that failed for good: its flush raises the fatal error, as confluent-kafka
does, often as a SystemError caused by it. The close logs it and goes on (the committer's
transactional producer, the delay service's tiers), and an error that stopped run() is the one
raised, not hidden by the close's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive.consumer.committer import Committer
from redrive.delay import DelayService
from redrive.delay.tiers import DEFAULT_TIERS
from redrive.errors import DelayServiceError
from redrive.kafka.transactions import TransactionalProducer

FATAL = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True)


def system_error(cause: BaseException) -> SystemError:
    """What confluent-kafka raises for an error met while serving delivery reports."""
    error = SystemError("<built-in function callback> returned a result with an exception set")
    error.__cause__ = cause
    return error


# What a failed producer's flush raises: the fatal error, a SystemError caused by it, or the
# cause-less SystemError seen after a noida-db restart.
FAILURES: list[Callable[[], BaseException]] = [
    lambda: KafkaException(FATAL),
    lambda: system_error(KafkaException(FATAL)),
    lambda: SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without "
                        "setting an exception"),
]
IDS = ["kafka-exception", "system-error", "cause-less"]


class FailedProducer:
    def __init__(self, raises: Callable[[], BaseException]) -> None:
        self.raises = raises
        self.flushed = False

    def flush(self, timeout_s: float) -> int:
        self.flushed = True
        raise self.raises()

    def init_transactions(self, timeout_s: float) -> None:
        pass


class ClosedTransactions:
    closed = False

    def close(self) -> None:
        self.closed = True


def committer(producer: Any, transactions: Any = None) -> Committer:
    return Committer("g", None, None, None, set(), 1.0, None,  # type: ignore[arg-type]
                     producer=producer, transactions=transactions)


@pytest.mark.parametrize("raises", FAILURES, ids=IDS)
def test_the_committer_closes_past_a_producer_that_failed_for_good(
        raises: Callable[[], BaseException]) -> None:
    producer, transactions = FailedProducer(raises), ClosedTransactions()
    # Raised the SystemError before, and skipped the rest of the close.
    committer(producer, transactions).close(time.monotonic() + 1)
    assert producer.flushed and transactions.closed


def test_the_committer_raises_any_other_error_of_its_flush() -> None:
    with pytest.raises(SystemError):
        bug = FailedProducer(lambda: system_error(ValueError("a bug in a callback")))
        committer(bug).close(time.monotonic() + 1)


@pytest.mark.parametrize("raises", FAILURES, ids=IDS)
def test_a_transactional_producer_closes_past_its_failed_producer(
        raises: Callable[[], BaseException]) -> None:
    failed = FailedProducer(raises)
    transactions = TransactionalProducer("127.0.0.1:9", "tid", make=lambda *a, **k: failed)
    transactions.start()
    transactions.close()
    assert failed.flushed and transactions._producer is None


class ClosingConsumer:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("raises", FAILURES, ids=IDS)
def test_the_delay_service_raises_what_stopped_it_not_its_failed_producer_s_flush(
        raises: Callable[[], BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    service = DelayService("127.0.0.1:9", transactional=False)
    failed = FailedProducer(raises)

    def start() -> None:
        service._consumer = ClosingConsumer()  # type: ignore[assignment]
        service._producer = failed  # type: ignore[assignment]
        service._tiers = {(DEFAULT_TIERS.tiers[0].topic, 0): DEFAULT_TIERS.tiers[0]}

    def step() -> None:
        raise DelayServiceError("fatal consumer error: what stopped it")

    monkeypatch.setattr(service, "_start", start)
    monkeypatch.setattr(service, "_step", step)
    # Off the main thread: run() leaves the test process's signal handlers alone there.
    raised: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert len(raised) == 1 and isinstance(raised[0], DelayServiceError), raised
    assert failed.flushed and service._producer is None and not service.assignment
