"""redrive: non-blocking retries, delay queues and dead-letter topics with replay for Kafka."""

from redrive.errors import (
    BrokerUnavailable,
    DeliveryFailed,
    InvalidPolicy,
    MalformedHeader,
    RedriveError,
)
from redrive.record import Delivery, ErrorInfo, Origin, Record

__all__ = [
    "BrokerUnavailable",
    "Delivery",
    "DeliveryFailed",
    "ErrorInfo",
    "InvalidPolicy",
    "MalformedHeader",
    "Origin",
    "Record",
    "RedriveError",
]
__version__ = "0.1.0"
