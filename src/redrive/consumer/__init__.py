"""The plain-Python runtime: RetryingConsumer (non-blocking retry topics, holding partitions until
records are due, in-place retries for errors marked so, optional exactly-once routing)."""

from redrive.consumer.runtime import Handler, RetryingConsumer

__all__ = ["Handler", "RetryingConsumer"]
