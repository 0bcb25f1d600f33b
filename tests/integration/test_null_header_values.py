"""A header whose value is null (Kafka tells it from an empty one: Java's Header.value() returns
null) stays null in every copy redrive makes: the consumer's retry and dead-letter copies, the
delay service's forwarded records, the store's republished ones, and replays. Before, each
turned it into an empty value."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from fastapi.testclient import TestClient

from redrive import headers as h
from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers
from redrive.ops.replay import TO_ORIGINAL, replay
from redrive.ops.web import create_app
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, Scheduler, StoreBackend

from .background import Running
from .consumer.conftest import FAST_GROUP, Handled, committed, wait_until
from .delay.conftest import TEST_TIERS, now_ms
from .delay.conftest import running as service_running
from .ops.conftest import run_cli
from .records import produce_input

pytestmark = pytest.mark.integration

HEADERS: list[tuple[str, bytes | None]] = [("trace-flag", None), ("empty", b""), ("plain", b"1")]


def raw_headers(bootstrap: str, topic: str, expect: int) -> list[list[tuple[str, bytes | None]]]:
    """Each record's headers as confluent-kafka reads them off the wire, redrive's left out."""
    consumer = kafka.consumer(bootstrap)
    partitions = kafka.partition_count(kafka.admin(bootstrap), topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: list[list[tuple[str, bytes | None]]] = []
    deadline = time.monotonic() + 20
    try:
        while len(found) < expect and time.monotonic() < deadline:
            found += [[(name, value) for name, value in message.headers() or []
                       if not name.startswith(h.PREFIX)]
                      for message in consumer.consume(100, 0.2) if message.error() is None]
    finally:
        consumer.close()
    assert len(found) == expect, f"{topic}: {len(found)} records, expected {expect}"
    return found


def produce(bootstrap: str, topic: str, value: bytes,
            headers: list[tuple[str, bytes | None]]) -> None:
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, value, None, headers)])


def test_the_consumers_copies_and_its_handler_keep_a_null_value(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str],
        running: Callable[[RetryingConsumer], Running]) -> None:
    topic, group = new_topic(), unique_name("nulls")
    produce(bootstrap, topic, b"retry", HEADERS)
    produce(bootstrap, topic, b"dead", HEADERS)
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"dead" or record.delivery.attempt == 0:
            raise RuntimeError("fails")

    run = running(RetryingConsumer(bootstrap, topic, group,
                                   RetryPolicy(backoff=Backoff.sequence("1s")), handler,
                                   config=FAST_GROUP))
    retry = f"{topic}.{group}.retry.1s"
    wait_until(lambda: committed(bootstrap, group, retry) == {0: 2}, 30, "both retries done")
    run.stop()
    with seen.lock:
        handed = [[(n, v) for n, v in record.headers if not n.startswith(h.PREFIX)]
                  for record, _ in seen.calls]
    assert handed == [HEADERS] * 4  # each record, then its retry
    assert raw_headers(bootstrap, retry, 2) == [HEADERS] * 2
    assert raw_headers(bootstrap, f"{topic}.{group}.dlt", 1) == [HEADERS]


def test_a_null_redrive_header_is_dead_lettered_as_malformed_naming_it_null(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str],
        running: Callable[[RetryingConsumer], Running]) -> None:
    topic, group = new_topic(), unique_name("nullattempt")
    produce(bootstrap, topic, b"odd", [(h.ATTEMPT, None), ("plain", b"1")])
    produce(bootstrap, topic, b"fine", [])
    seen = Handled()
    run = running(RetryingConsumer(bootstrap, topic, group, RetryPolicy(), seen.add,
                                   config=FAST_GROUP))
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 2}, 30, "both records done")
    run.stop()
    assert seen.values() == [b"fine"]
    consumer = kafka.consumer(bootstrap)
    consumer.assign([TopicPartition(f"{topic}.{group}.dlt", 0, 0)])
    try:
        dead = [m for m in consumer.consume(10, 10) if m.error() is None]
    finally:
        consumer.close()
    assert [m.value() for m in dead] == [b"odd"]
    headers = kafka.message_headers(dead[0])
    assert h.last(headers, h.REASON) == b"malformed"
    assert h.last(headers, h.ERROR_MESSAGE) == (
        b"malformed header redrive-attempt=None: a null value (expected a decimal integer)")
    # the unreadable value kept as it came, null
    assert ("redrive-malformed-attempt", None) in headers


def test_the_delay_service_forwards_a_null_value_as_null(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str]) -> None:
    target = new_topic(1)
    tiers = Tiers.of(TEST_TIERS, prefix=f"{unique_name('delay')}.delay")
    service = DelayService(bootstrap, tiers, instance_id=unique_name("i"), partitions=1,
                           group_id=unique_name("g"))
    with service_running(service):
        produce(bootstrap, tiers.topics[0], b"later",
                [*HEADERS, (h.TARGET, target.encode()), (h.DUE, str(now_ms()).encode())])
        assert raw_headers(bootstrap, target, 1) == [HEADERS]


def test_the_store_republishes_a_null_value_as_null(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str],
        running: Callable[[RetryingConsumer], Running], tmp_path: Path) -> None:
    topic, group = new_topic(), unique_name("stored-nulls")
    produce(bootstrap, topic, b"once", HEADERS)
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.delivery.attempt == 0:
            raise RuntimeError("fails once")

    with RetryStore(tmp_path / "store.db") as store:
        run = running(RetryingConsumer(bootstrap, topic, group,
                                       RetryPolicy(backoff=Backoff.fixed("200ms")), handler,
                                       config=FAST_GROUP, retry_backend=StoreBackend(store)))
        scheduler = Scheduler(store, bootstrap)
        try:
            wait_until(lambda: scheduler.run_once().published == 1, 30, "the retry republished")
        finally:
            scheduler.close()
        wait_until(lambda: len(seen.calls) == 2, 30, "the retry handled")
        run.stop()
    assert raw_headers(bootstrap, topic, 2) == [HEADERS] * 2  # the original, then its copy
    assert [n_v for n_v in seen.calls[1][0].headers if n_v[0] == "trace-flag"] == [
        ("trace-flag", None)]


def test_the_tools_show_a_null_value_as_null_and_never_match_it_as_empty(
        bootstrap: str, new_topic: Callable[..., str]) -> None:
    dlt = new_topic()
    produce(bootstrap, dlt, b"dead", [*HEADERS, (h.REASON, b"exhausted")])
    web = TestClient(create_app(bootstrap, timeout_s=5.0))
    page = web.get(f"/dead-letters/{dlt}/0/0")
    assert page.status_code == 200
    assert "<th>trace-flag</th><td><i>(null)</i></td>" in page.text
    assert "<th>empty</th><td></td>" in page.text
    shown = web.get(f"/api/dead-letters/{dlt}/0/0").json()
    assert ["trace-flag", None] in shown["headers"] and ["empty", ""] in shown["headers"]
    base = ["dlt", "ls", "-b", bootstrap, "--dlt-topic", dlt, "--json", "--header"]
    assert len(json.loads(run_cli(*base, "empty=").stdout)) == 1
    assert json.loads(run_cli(*base, "trace-flag=").stdout) == []  # null is not empty


def test_a_replay_keeps_a_null_value_null(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str]) -> None:
    topic, dlt = new_topic(), new_topic()
    produce(bootstrap, dlt, b"dead", [
        *HEADERS, (h.REASON, b"exhausted"), (h.GROUP, unique_name("g").encode()),
        (h.ORIGINAL_TOPIC, topic.encode()), (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0")])
    report = replay(bootstrap, dlt, to=TO_ORIGINAL)
    assert len(report.replayed) == 1
    assert raw_headers(bootstrap, topic, 1) == [HEADERS]
