"""A transaction whose send_offsets_to_transaction is answered with a rebalance's error: the
consumer's group metadata is of a generation that ended. librdkafka's TxnOffsetCommit handler
makes ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID and FENCED_INSTANCE_ID (and, as any code it does not
name, REBALANCE_IN_PROGRESS) an abortable error, not a retriable one, so they used to count as a
refusal of the copies: the partitions held 1 s, doubling to a minute. Nothing was refused; the
next poll joins the new generation, so the batch is read again at once."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from redrive import kafka
from redrive.consumer.batch import Batch as ConsumerBatch
from redrive.consumer.batch import Copy
from redrive.consumer.committer import Committer
from redrive.delay import DelayService
from redrive.delay.batch import Batch
from redrive.delay.tiers import DEFAULT_TIERS
from redrive.kafka.health import BrokerHealth
from redrive.kafka.holds import Holds
from redrive.kafka.produce import passing_failure
from redrive.kafka.transactions import TransactionAborted
from redrive.metrics import Metrics
from redrive.routing import Retry

from ..fakes import FakeConsumer

TIER = (DEFAULT_TIERS.tiers[0].topic, 0)

REBALANCED = [
    KafkaError(KafkaError.ILLEGAL_GENERATION, "Failed to commit offsets to transaction on "
               "broker b:9092/1: orders[0]: Broker: Specified group generation id is not valid",
               txn_requires_abort=True),
    KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "Broker: Unknown member", txn_requires_abort=True),
    KafkaError(KafkaError.FENCED_INSTANCE_ID, "Broker: Static consumer fenced by other consumer "
               "with same group.instance.id", txn_requires_abort=True),
    KafkaError(KafkaError.REBALANCE_IN_PROGRESS, "Broker: Group rebalance in progress",
               txn_requires_abort=True),
]
IDS = ["illegal-generation", "unknown-member", "fenced-instance", "rebalance-in-progress"]


def aborted(error: KafkaError) -> TransactionAborted:
    """What TransactionalProducer.run raises after aborting for `error`."""
    try:
        raise TransactionAborted(f"aborted: {error.str()}") from KafkaException(error)
    except TransactionAborted as exc:
        return exc


class AbortingTransactions:
    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def commit(self, *args: Any, **kwargs: Any) -> None:
        raise aborted(self.error)


@pytest.mark.parametrize("error", REBALANCED, ids=IDS)
def test_a_rebalance_s_answer_is_a_passing_failure(error: KafkaError) -> None:
    assert not error.retriable() and error.txn_requires_abort()
    assert passing_failure(aborted(error))


def test_a_refusal_is_still_not_one() -> None:
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization "
                         "failed", txn_requires_abort=True)
    assert not passing_failure(aborted(refused))


@pytest.mark.parametrize("error", REBALANCED, ids=IDS)
def test_the_delay_service_reads_a_rebalanced_batch_again_at_once(error: KafkaError) -> None:
    service = DelayService("127.0.0.1:9")
    consumer = FakeConsumer()
    service._consumer = consumer  # type: ignore[assignment]
    service._transactions = AbortingTransactions(error)  # type: ignore[assignment]
    other = (DEFAULT_TIERS.tiers[1].topic, 0)
    service._tiers = {TIER: DEFAULT_TIERS.tiers[0], other: DEFAULT_TIERS.tiers[1]}
    batch = Batch()
    batch.add(TIER, 7, kafka.OutRecord("orders", b"v"))
    batch.add(other, 3, kafka.OutRecord("orders", b"w"))
    batch.starts.update({TIER: 7, other: 3})
    batch.offsets += [TopicPartition(*TIER, 8), TopicPartition(*other, 4)]
    assert service._forward(batch)
    assert sorted(consumer.seeks) == sorted([(*TIER, 7), (*other, 3)])
    assert consumer.paused == [] and len(service._holds) == 0
    assert not service.health.down


@pytest.mark.parametrize("error", REBALANCED, ids=IDS)
def test_the_consumer_runtime_reads_a_rebalanced_batch_again_at_once(error: KafkaError) -> None:
    consumer = FakeConsumer()
    metrics = Metrics("consumer", "g")
    committer = Committer("g", consumer, None, metrics, {TIER}, 1.0,  # type: ignore[arg-type]
                          BrokerHealth("test", metrics), holds=Holds(),
                          transactions=AbortingTransactions(error))  # type: ignore[arg-type]
    batch = ConsumerBatch(first={TIER: 7})
    retry = Retry("orders.g.retry.5s", 0, [], 1, None)
    batch.route(Copy(kafka.OutRecord(retry.topic, b"v"), retry, "orders", TIER, 7))
    assert committer._commit_transaction(batch, {TIER: 8}) is False
    assert consumer.seeks == [(*TIER, 7)]
    assert consumer.paused == []
