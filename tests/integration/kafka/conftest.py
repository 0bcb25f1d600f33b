"""Helpers of the redrive.kafka integration tests: producing plain and transactional records,
deleting records below an offset, and reading a partition the way a plain consumer sees it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from redrive import kafka

from ..records import produce_input

# Generous: the machine has two cores and other suites run beside this one.
DEADLINE_S = 30.0


def produce_values(bootstrap: str, topic: str, values: Sequence[str], *, partition: int = 0,
                   headers: Sequence[tuple[str, bytes]] = ()) -> list[kafka.Delivered]:
    """Produce `values` (keys k<value>) to one partition and wait for the acks."""
    records = [kafka.OutRecord(topic, value.encode(), f"k-{value}".encode(),
                               [*headers, ("value", value.encode())], partition=partition)
               for value in values]
    return produce_input(bootstrap, records)


def produce_transactions(bootstrap: str, topic: str, transactional_id: str,
                         transactions: Sequence[tuple[Sequence[str], bool]], *,
                         partition: int = 0) -> None:
    """Produce each (values, commit) to one partition as one transaction, committed or aborted."""
    producer = kafka.producer(bootstrap, transactional_id=transactional_id)
    producer.init_transactions(DEADLINE_S)
    for values, commit in transactions:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value.encode(), partition=partition)
        assert producer.flush(DEADLINE_S) == 0
        if commit:
            producer.commit_transaction(DEADLINE_S)
        else:
            producer.abort_transaction(DEADLINE_S)


def delete_records_below(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """DeleteRecords: make `offset` the partition's first offset, and wait until it is."""
    admin = kafka.admin(bootstrap)  # kept alive while its futures run
    for future in admin.delete_records([TopicPartition(topic, partition, offset)],
                                       request_timeout=DEADLINE_S,
                                       operation_timeout=DEADLINE_S).values():
        future.result(DEADLINE_S)
    reader = kafka.consumer(bootstrap)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while (low := kafka.watermarks(reader, topic, partition)[0]) != offset:
            assert time.monotonic() < deadline, f"first offset {low}, expected {offset}"
            time.sleep(0.05)
    finally:
        reader.close()


def read_partition(bootstrap: str, topic: str, partition: int, *,
                   isolation: str = "read_committed",
                   overrides: Mapping[str, Any] | None = None) -> list[Message]:
    """Every record of the partition from its first offset to its end (end-of-partition event
    at the high watermark, or at the last stable offset under read_committed)."""
    reader = kafka.consumer(bootstrap, overrides={"isolation.level": isolation,
                                                  "enable.partition.eof": True,
                                                  **(overrides or {})})
    reader.assign([TopicPartition(topic, partition, 0)])
    received: list[Message] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            assert time.monotonic() < deadline, f"{topic}[{partition}]: no end in {DEADLINE_S}s"
            message = reader.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return received
            assert error is None, error
            received.append(message)
    finally:
        reader.close()


def values_of(messages: Sequence[Message]) -> list[str]:
    return [bytes(m.value() or b"").decode() for m in messages]


def offsets_of(messages: Sequence[Message]) -> list[int]:
    return [int(m.offset() or 0) for m in messages]
