"""What a transactional DelayService does with a batch whose transaction aborted, by its cause:
an outage is reported to the health and the tiers read again at once, a passing state is read
again at once, and a refusal holds the tier partitions with growing pauses."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.delay import DelayService
from redrive.delay.batch import Batch
from redrive.delay.tiers import DEFAULT_TIERS
from redrive.errors import InvalidArgument, MalformedHeader
from redrive.kafka.transactions import TransactionAborted

from ..fakes import FakeConsumer

TIER = (DEFAULT_TIERS.tiers[0].topic, 0)


class AbortingTransactions:
    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def commit(self, *args: Any, **kwargs: Any) -> None:
        cause = KafkaException(self.error)
        raise TransactionAborted(f"aborted: {self.error.str()}") from cause


@pytest.mark.parametrize("error, held, outage", [
    (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "larger than the target takes"), True, False),
    (KafkaError(KafkaError._STATE, "Local: Erroneous state"), False, False),
    (KafkaError(KafkaError.NOT_COORDINATOR, "coordinator moved", retriable=True), False, False),
    # Before, an aborted transaction was never taken for an outage: it was held as a refusal,
    # up to a minute at a time, and the service's health never heard of the brokers' absence.
    (KafkaError(KafkaError._TIMED_OUT, "no answer"), False, True),
], ids=["refused", "erroneous-state", "retriable", "unanswered"])
def test_an_aborted_forward_is_held_only_when_a_copy_was_refused(
        error: KafkaError, held: bool, outage: bool) -> None:
    service = DelayService("127.0.0.1:9")
    consumer = FakeConsumer()
    service._consumer = consumer  # type: ignore[assignment]
    service._transactions = AbortingTransactions(error)  # type: ignore[assignment]
    service._tiers = {TIER: DEFAULT_TIERS.tiers[0]}
    batch = Batch()
    batch.add(TIER, 7, kafka.OutRecord("orders", b"v"))
    batch.starts[TIER] = 7
    batch.offsets.append(TopicPartition(*TIER, 8))
    service._forward(batch)
    assert consumer.seeks == [(*TIER, 7)]
    assert (TIER in service._holds) is held
    if held:
        assert 0.9 <= service._holds.wait_s(now_ms(), 100.0) <= 1.0
    assert service.health.down is outage
    assert service.metrics.total("redrive_forwarded_total") == 0


class Fetched:
    """A record fetched from a tier before the brokers went away, for a target not seen yet."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TIER[0]

    def partition(self) -> int:
        return TIER[1]

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"v"

    def timestamp(self) -> tuple[int, int]:
        return (1, now_ms() - 5_000)

    def headers(self) -> list[tuple[str, bytes]]:
        return [(h.DUE, b"%d" % (now_ms() - 1_000)), (h.TARGET, b"orders")]


class BrokersAway(FakeConsumer):
    def poll(self, timeout: float) -> Fetched:
        return Fetched(7)

    def consume(self, count: int, timeout: float) -> list[Fetched]:
        return [Fetched(8)]

    def list_topics(self, timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))


def test_a_target_that_cannot_be_checked_in_an_outage_is_read_again_not_fatal() -> None:
    service = DelayService("127.0.0.1:9")
    consumer = BrokersAway()
    service._consumer = consumer  # type: ignore[assignment]
    service._producer = None
    service._tiers = {TIER: DEFAULT_TIERS.tiers[0]}
    service._step()  # raised KafkaException out of run() before
    assert consumer.seeks == [(*TIER, 7)]
    assert service.health.down
    assert service.metrics.total("redrive_forwarded_total") == 0
    assert service.metrics.total("redrive_dead_lettered_total") == 0


class Listed:
    def __init__(self, partitions: int) -> None:
        self.error = None
        self.partitions = dict.fromkeys(range(partitions))


class Metadata:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = {name: Listed(count) for name, count in topics.items()}


class Deleting(FakeConsumer):
    def list_topics(self, timeout: float) -> Metadata:
        return Metadata({"orders": 0, "payments": 1})


def test_a_target_listed_without_partitions_is_no_target() -> None:
    service = DelayService("127.0.0.1:9")
    service._consumer = Deleting()  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match="redrive-target='orders': no such topic"):
        service._check_target(b"orders")
    service._refreshed = False
    assert service._check_target(b"payments") == "payments"


@pytest.mark.parametrize("headers, says", [
    ([(h.DUE, b"1")], "redrive-target=None: missing: the delay service needs the topic"),
    ([(h.DUE, b"1"), (h.TARGET, b"orders"), (h.TARGET, None)],
     "redrive-target=None: a null value: the delay service needs the topic"),
])
def test_a_record_without_a_target_is_malformed_naming_a_null_as_null(
        headers: list[tuple[str, bytes | None]], says: str) -> None:
    service = DelayService("127.0.0.1:9")
    with pytest.raises(Exception) as caught:
        service._read(headers)
    error = getattr(caught.value, "error", None)
    assert isinstance(error, MalformedHeader)
    assert says in str(error)
