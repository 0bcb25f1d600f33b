"""The records of a batch that a backend which looks records up (the store) is asked about
ahead, in one lookup, before the batch is handled one record at a time."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Message

from redrive import headers as h
from redrive.errors import MalformedHeader
from redrive.kafka.records import headers_or_malformed
from redrive.record import NO_HISTORY, Record, new_record


def records_to_admit(messages: Sequence[Message], group: str, every: bool) -> list[Record]:
    """Those the backend's `admit` may be asked about and wants ahead: the records with redrive
    headers of this group (`every` record, for a sequential backend), built as the runtime's
    handling builds them."""
    records: list[Record] = []
    for message in messages:
        if message.error() is not None:
            continue
        raw_headers = headers_or_malformed(message)
        if (raw_headers is None and not every) or isinstance(raw_headers, MalformedHeader):
            continue  # one whose header names cannot be read is dead-lettered, not admitted
        headers = h.normalize(raw_headers)
        delivery = NO_HISTORY
        if headers and h.has_redrive(headers):
            try:
                delivery = h.read_delivery(headers)
            except MalformedHeader:
                continue  # routed as malformed, never admitted
            if delivery.group is not None and delivery.group != group:
                continue  # skipped as another group's, never admitted
        elif not every:
            continue
        records.append(new_record(message.topic(), message.partition(), message.offset(),
                                  message.timestamp()[1], message.key(), message.value(),
                                  headers, delivery))
    return records
