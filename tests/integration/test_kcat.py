"""redrive's headers as kcat, a client other than confluent-kafka's Python binding, sees them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from redrive import headers, kafka
from redrive.record import Delivery, Origin

from .records import produce_input

DUE_MS = 1795331951174
FIRST_FAILURE_MS = 1795331650000


def kcat_path() -> str:
    found = shutil.which("kcat")
    if found is None:
        message = "kcat is not on PATH; `make tools` installs it (Debian package kcat)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def kcat_consume(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kcat_path(), "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-J", "-q"],
        capture_output=True, timeout=60, check=True)
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


def read_one(bootstrap: str, topic: str, timeout_s: float = 30.0) -> Message:
    consumer = kafka.consumer(bootstrap)
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                return message
    finally:
        consumer.close()
    raise AssertionError(f"no record on {topic} within {timeout_s}s")


def test_kcat_sees_redrive_headers_exactly_as_written(
        bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    user_headers = [("trace-id", b"4bf92f3577b34da6"), (headers.ATTEMPT, b"1"),
                    ("note", "café ☕".encode())]
    written = headers.replace(user_headers, {
        headers.ATTEMPT: 2,
        headers.DUE: DUE_MS,
        headers.GROUP: "enricher",
        headers.ORIGINAL_TOPIC: "orders",
        headers.ORIGINAL_PARTITION: 3,
        headers.ORIGINAL_OFFSET: 41,
        headers.ERROR_TYPE: "builtins.ValueError",
    })
    produce_input(bootstrap, [
        kafka.OutRecord(topic, value=b'{"order": 41}', key=b"order-41", headers=written)])

    [seen] = kcat_consume(bootstrap, topic)

    assert seen["headers"] == [
        "trace-id", "4bf92f3577b34da6",
        "note", "café ☕",
        "redrive-attempt", "2",
        "redrive-due", str(DUE_MS),
        "redrive-group", "enricher",
        "redrive-original-topic", "orders",
        "redrive-original-partition", "3",
        "redrive-original-offset", "41",
        "redrive-error-type", "builtins.ValueError",
    ]
    assert (seen["topic"], seen["partition"], seen["offset"]) == (topic, 0, 0)
    assert (seen["key"], seen["payload"]) == ("order-41", '{"order": 41}')


def test_redrive_reads_headers_that_kcat_wrote(bootstrap: str,
                                               new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    kcat_headers = {headers.ATTEMPT: "3", headers.DUE: str(DUE_MS), headers.GROUP: "enricher",
                    headers.ORIGINAL_TOPIC: "orders", headers.ORIGINAL_PARTITION: "3",
                    headers.ORIGINAL_OFFSET: "41", headers.FIRST_FAILURE: str(FIRST_FAILURE_MS)}
    command = [kcat_path(), "-P", "-b", bootstrap, "-t", topic, "-k", "order-41"]
    for name, value in kcat_headers.items():
        command += ["-H", f"{name}={value}"]
    subprocess.run(command, input=b"payload", capture_output=True, timeout=60, check=True)

    message = read_one(bootstrap, topic)

    assert kafka.message_headers(message) == [(k, v.encode()) for k, v in kcat_headers.items()]
    assert headers.read_delivery(kafka.message_headers(message)) == Delivery(
        attempt=3, first_failure_ms=FIRST_FAILURE_MS, group="enricher",
        original=Origin("orders", 3, 41), due_ms=DUE_MS)
    assert (message.key(), message.value()) == (b"order-41", b"payload")
