"""Changing a topic's configs while a test runs, as an operator would with kafka-configs."""

from __future__ import annotations

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from redrive import kafka


def set_record_limit(bootstrap: str, topic: str, limit: int) -> None:
    """Set the topic's max.message.bytes and wait until the broker has."""
    admin = kafka.admin(bootstrap)  # kept until the futures are done: a dropped client fails them
    altered = admin.incremental_alter_configs([ConfigResource(
        ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(
            "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])])
    for future in altered.values():
        future.result(10)
