"""Retry backends: where a runtime sends the records that failed (see `contract`).

`RetryTopics` (retry and dead-letter topics, the default) lives here; `redrive.store.StoreBackend`
keeps failed records in a database. Both implement the contract below the runtimes, so that a
runtime never depends on the store.
"""

from redrive.backends.contract import BoundBackend, RetryBackend, Verdict
from redrive.backends.retry_topics import RetryTopics

__all__ = ["BoundBackend", "RetryBackend", "RetryTopics", "Verdict"]
