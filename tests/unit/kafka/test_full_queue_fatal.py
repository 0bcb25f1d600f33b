"""A producer whose queue is full (an outage) and that fails for good while produce() waits for
room (a broker restart that lost its idempotence state): the wait's poll raises the fatal error
as confluent-kafka does, a SystemError, which must reach callers as DeliveryFailed(fatal=True),
as from a flush, so that they replace the producer instead of ending."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from redrive import kafka
from redrive.delay import DelayService
from redrive.delay.batch import Batch
from redrive.delay.tiers import DEFAULT_TIERS
from redrive.errors import DeliveryFailed
from redrive.kafka import OutRecord
from redrive.kafka.produce import produce, producer_failed

TIER = (DEFAULT_TIERS.tiers[0].topic, 0)
FATAL = KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True))


class FullThenFailed:
    """A producer whose queue is full and whose poll raises what confluent-kafka raises when
    librdkafka fails the producer meanwhile (`cause` None: the cause-less SystemError)."""

    def __init__(self, cause: BaseException | None = FATAL) -> None:
        self.cause = cause
        self.polls = 0
        self.purged = False

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("Local: Queue full")

    def poll(self, timeout_s: float) -> int:
        self.polls += 1
        if self.cause is None:
            raise SystemError("<method 'poll' of 'cimpl.Producer' objects> returned NULL "
                              "without setting an exception")
        raise SystemError("<built-in function callback> returned a result with an exception "
                          "set") from self.cause

    def flush(self, timeout_s: float) -> int:
        return 0

    def purge(self) -> None:
        self.purged = True


@pytest.mark.parametrize("cause", [FATAL, None], ids=["caused", "cause-less"])
def test_a_producer_failed_while_waiting_for_queue_room_is_a_fatal_delivery_failure(
        cause: BaseException | None) -> None:
    producer = FullThenFailed(cause)
    with pytest.raises(DeliveryFailed, match=r"delivery to orders failed: the producer failed "
                                             r"for good") as raised:
        produce(producer, OutRecord("orders", b"v"), wait_s=5.0)  # type: ignore[arg-type]
    assert raised.value.fatal and producer_failed(raised.value)
    assert producer.polls == 1


def test_any_other_system_error_while_waiting_is_raised_as_it_is() -> None:
    with pytest.raises(SystemError):
        produce(FullThenFailed(ValueError("a bug in a callback")),  # type: ignore[arg-type]
                OutRecord("orders", b"v"), wait_s=5.0)


class FakeConsumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[str, int, int]] = []
        self.commits = 0

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.commits += 1


def test_the_at_least_once_delay_service_replaces_a_producer_failed_while_its_queue_was_full(
        ) -> None:
    service = DelayService("127.0.0.1:9", transactional=False)
    consumer = FakeConsumer()
    failed = FullThenFailed()
    service._consumer = consumer  # type: ignore[assignment]
    service._producer = failed  # type: ignore[assignment]
    service._tiers = {TIER: DEFAULT_TIERS.tiers[0]}
    batch = Batch()
    batch.add(TIER, 7, kafka.OutRecord("orders", b"v"))
    batch.starts[TIER] = 7
    batch.offsets.append(TopicPartition(*TIER, 8))
    try:
        # Raised SystemError out of run() before.
        assert service._forward(batch) is False
        assert failed.purged and service._producer is not failed
        assert consumer.seeks == [(*TIER, 7)] and consumer.commits == 0
        assert TIER not in service._holds  # read again at once: nothing refused it
    finally:
        if service._producer is not failed and service._producer is not None:
            service._producer.purge()
            service._producer.flush(0)
