"""The tests' input records, written as a user's own application writes them.

redrive's producers are idempotent, and librdkafka asks for an idempotent producer's id on a
500 ms timer, so a helper that made one per call waited 0.5-1 s for its first acknowledgement
each time (the consumer tests took 101 s on 3 workers, 55 s with this producer). Input records
need only acks=all: these helpers send each batch once and wait for every acknowledgement.
"""

from __future__ import annotations

from collections.abc import Iterable

import confluent_kafka

from redrive import kafka


def input_producer(bootstrap: str) -> confluent_kafka.Producer:
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})


def produce_input(bootstrap: str, records: Iterable[kafka.OutRecord]) -> list[kafka.Delivered]:
    """Write the records; where each landed, once the broker acknowledged them all."""
    return kafka.produce_confirmed(input_producer(bootstrap), list(records))
