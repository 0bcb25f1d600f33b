"""What a failure from the brokers says, looked for through its wrappers.

Callers see wrappers: an aborted transaction raised from its timed-out call, the SystemError
confluent-kafka raises from a delivery callback's error. So each judgement of a failure (an
outage, a producer failed for good, a passing state) reads the exception and every exception
it was raised from.
"""

from __future__ import annotations

from collections.abc import Iterator

from confluent_kafka import KafkaError, KafkaException


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then the exception it was raised from, and so on."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a KafkaException carries; None for anything else."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error if isinstance(error, KafkaError) else None
