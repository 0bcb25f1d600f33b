"""The one thin layer over confluent-kafka, and the mechanisms every runtime shares.

- `config`: client configs and clients (nothing else in redrive builds a raw client config);
- `records`, `produce`, `admin`: records to produce, confirmed produce, metadata and topics;
- `ranges`: read `[start, end)` of partitions, with one set of rules for errors, retention gaps
  and the end of data;
- `holds`: pause a partition at a record until a due time, resume it, drop it on revoke;
- `transactions`: produce and commit offsets in one transaction, surviving a fatal producer
  error by starting a new producer under the same transactional id.

`from redrive import kafka` gives the names of the first four.
"""

from redrive.kafka.admin import (
    check_reachable,
    create_topics,
    delete_topics,
    group_members,
    keeping,
    partition_count,
    record_limits,
    topic_partitions,
    watermarks,
)
from redrive.kafka.config import (
    CONSUMER_DEFAULTS,
    PRODUCER_DEFAULTS,
    Admin,
    ClientConfig,
    Connection,
    admin,
    admin_beside,
    client_config,
    consumer,
    consumer_config,
    producer,
    producer_config,
)
from redrive.kafka.produce import produce, produce_acked, produce_confirmed, produce_each
from redrive.kafka.records import Delivered, OutRecord, PartitionKey, message_headers

__all__ = [
    "CONSUMER_DEFAULTS", "PRODUCER_DEFAULTS", "Admin", "ClientConfig", "Connection", "Delivered",
    "OutRecord", "PartitionKey", "admin", "admin_beside", "check_reachable", "client_config",
    "consumer", "consumer_config", "create_topics", "delete_topics", "group_members", "keeping",
    "message_headers", "partition_count", "produce", "produce_acked", "produce_confirmed",
    "produce_each", "producer", "producer_config", "record_limits", "topic_partitions",
    "watermarks",
]
