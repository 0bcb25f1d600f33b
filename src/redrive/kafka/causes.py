"""What a failure from the brokers says, looked for through its wrappers, and what it must not
keep alive.

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


def drop_stack(exc: BaseException) -> None:
    """Cut `exc` from the stack it was raised through, where something outlives the handling
    of it. confluent-kafka keeps for good a fatal producer error's SystemError (seen after a
    noida-db restart) and the errors of transactional calls that timed out (a send of offsets,
    an abort: seen in a test, held with no referrer Python knows of); an admin request's
    future keeps its error. Through its traceback the exception keeps every frame of that
    stack alive, and with them their locals, a client that goes on reconnecting to its brokers
    among them: for good, or until the collector's next full pass finds the future's cycle."""
    exc.__traceback__ = None
