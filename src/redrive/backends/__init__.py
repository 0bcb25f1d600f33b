"""Retry backends: where a runtime sends the records that failed (see `contract`).

`RetryTopics` (retry and dead-letter topics, the default) and `DelayQueue` (the delay service's
shared tiers, back to the topic each record failed on) live here; `redrive.store.StoreBackend`
keeps failed records in a database. All implement the contract below the runtimes, so that a
runtime never depends on the store.
"""

from redrive.backends.contract import BoundBackend, RetryBackend, Verdict
from redrive.backends.delay_queue import DelayQueue
from redrive.backends.retry_topics import RetryTopics

__all__ = ["BoundBackend", "DelayQueue", "RetryBackend", "RetryTopics", "Verdict"]
