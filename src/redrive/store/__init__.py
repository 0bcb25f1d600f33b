"""The durable retry store (SQLite by default, PostgreSQL in production) and its scheduler.

    store = RetryStore("postgresql://redrive@db/redrive")     # or a file path: SQLite
    consumer = RetryingConsumer(bootstrap, "orders", "billing", policy, handle,
                                retry_backend=StoreBackend(store, ordering=True))
    Scheduler(store, bootstrap, webhook="https://ops.example/dead").run()
"""

from redrive.store.backend import StoreBackend
from redrive.store.database import StoreUnavailable
from redrive.store.rows import RowFilter, StoredRetry
from redrive.store.scheduler import Pass, Scheduler
from redrive.store.schema import PAYLOAD, REFERENCE, STATUSES
from redrive.store.store import RetryStore
from redrive.store.webhook import Webhook

__all__ = [
    "PAYLOAD",
    "REFERENCE",
    "STATUSES",
    "Pass",
    "RetryStore",
    "RowFilter",
    "Scheduler",
    "StoreBackend",
    "StoreUnavailable",
    "StoredRetry",
    "Webhook",
]
