"""The exceptions redrive raises. Each names the field and the value that were wrong."""

from __future__ import annotations


class RedriveError(Exception):
    """Base of every error redrive raises on purpose."""


class InvalidArgument(RedriveError, ValueError):
    """A setting was given a value redrive cannot work with."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid {field}={value!r}: {why}")


class InvalidPolicy(InvalidArgument):
    """A retry policy or one of its parts was given a value it cannot work with."""


class MalformedHeader(RedriveError, ValueError):
    """A redrive header is present but cannot be parsed; routing maps this to reason `malformed`."""

    def __init__(self, header: str, value: bytes | str | None, why: str) -> None:
        self.header = header
        self.value = value
        self.why = why
        super().__init__(f"malformed header {header}={value!r}: {why}")


class DeliveryFailed(RedriveError):
    """The broker did not acknowledge a produced record; the caller must not commit past it.

    unanswered: the broker did not answer in time (an outage), rather than refusing the record.
    fatal: the producer failed for good (librdkafka's fatal error) and must be replaced.
    """

    def __init__(self, topic: str, partition: int | None, why: str, *,
                 unanswered: bool = False, fatal: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.unanswered = unanswered
        self.fatal = fatal
        where = topic if partition is None or partition < 0 else f"{topic}[{partition}]"
        super().__init__(f"delivery to {where} failed: {why}")


class RecordTooLarge(RedriveError):
    """The producer refused a record as larger than its `message.max.bytes`; nothing is
    committed past it. `origin`: where a copy's record was first read, if known."""

    def __init__(self, topic: str, size: int, origin: str | None = None, *,
                 cut: bool = False) -> None:
        self.topic = topic
        self.size = size
        self.origin = origin
        what = f"the copy of {origin}" if origin else "a record"
        how = " even with its error text cut" if cut else ""
        super().__init__(
            f"{what} for topic {topic!r} carries {size:,} bytes, more than the producer's "
            f"message.max.bytes{how}: raise message.max.bytes in the settings of redrive's "
            f"producer (and max.message.bytes on {topic!r} if it is lower)")


class BrokerUnavailable(RedriveError):
    """No broker answered at the configured bootstrap address."""

    def __init__(self, bootstrap: str, why: str) -> None:
        self.bootstrap = bootstrap
        super().__init__(f"no Kafka broker reachable at bootstrap.servers={bootstrap!r}: {why}")


class DeadLetterBrakeTripped(RedriveError):
    """A Spark batch would have passed its policy's dead-letter limit: `stopped` names each
    partition and the offset of the dead letter that would have passed it. Nothing of the batch
    is copied, and the batch fails so that Spark commits none of it; the stops are kept in the
    control topic until `redrive resume` (in `command`) or the cool-off releases them."""

    def __init__(self, group: str, stopped: list[tuple[str, int, int]], limit: str,
                 command: str) -> None:
        self.group = group
        self.stopped = stopped
        self.command = command
        where = ", ".join(f"{topic}[{partition}] at offset {offset}"
                          for topic, partition, offset in stopped)
        super().__init__(f"group {group}: the dead-letter brake stopped {where} ({limit}); "
                         f"the batch is not committed until resumed: {command}")


class UnknownTopic(RedriveError):
    """A topic that an operation needs does not exist."""

    def __init__(self, topic: str, needed_as: str | None = None) -> None:
        self.topic = topic
        super().__init__(f"unknown topic {topic!r}: it does not exist on the cluster"
                         + (f" ({needed_as})" if needed_as else ""))


class OutputMismatch(RedriveError, TypeError):
    """A Spark pipeline's function returned what its output_schema cannot hold: not a mapping,
    none of the schema's fields, or a value of the wrong type. The record fails with it (routed
    by the policy like any error) instead of being written as nulls or failing the query."""


class DelayServiceError(RedriveError):
    """The delay service cannot go on (fenced by a newer instance, or a fatal client error)."""
