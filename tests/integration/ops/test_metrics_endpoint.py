"""The Prometheus endpoint of a running RetryingConsumer shows the counted outcomes."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from redrive.consumer import RetryingConsumer
from redrive.dev.ports import free_port
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from ..consumer.conftest import FAST_GROUP, Running, wait_until
from .conftest import produce_records

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Once(Exception):
    pass


class Fatal(ValueError):
    pass


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_endpoint_of_a_running_consumer(bootstrap: str, new_topic: NewTopic,
                                                unique_name: UniqueName,
                                                running: Start) -> None:
    topic, group = new_topic(), unique_name("metrics")
    port = free_port()
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=3, not_retryable=Fatal)

    def handler(record: Record) -> None:
        if record.value == b"once" and record.delivery.attempt == 0:
            raise Once("first try fails")
        if record.value == b"fatal":
            raise Fatal("never works")

    produce_records(bootstrap, topic, [(None, v, []) for v in
                                       (b"a", b"b", b"once", b"fatal", b"c", b"fatal")])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP,
                                   metrics_port=port))
    wait_until(lambda: run.total("redrive_processed_total") == 4
               and run.total("redrive_dead_lettered_total") == 2, 30, "4 processed, 2 dead")
    samples = scrape(port)
    run.stop()

    def value(name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"runtime": "consumer", "group": group, **labels}.items())))
        return samples[key]  # a missing or misspelt series fails here

    assert value("redrive_processed_total", topic=topic) == 4
    assert value("redrive_retried_total", topic=topic, attempt="1") == 1
    assert value("redrive_dead_lettered_total", topic=topic, reason="not-retryable") == 2
    assert value("redrive_rebalances_total", kind="assign") >= 1
    assert value("redrive_lateness_seconds_count") == 1  # the one retry, after its due time
    assert value("redrive_handler_seconds_count") >= 1  # timed on a sample of the calls
    assert value("redrive_paused_partitions") == 0


def test_every_gauge_is_a_series_from_the_start(bootstrap: str, new_topic: NewTopic,
                                                 unique_name: UniqueName) -> None:
    # A scrape before any partition was held still shows the paused-partitions gauge, at 0:
    # dashboards and alerts on it need the series, not its absence.
    topic, group = new_topic(), unique_name("gauges")
    port = free_port()
    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(backoff=Backoff.fixed("1s"), attempts=2),
                                lambda record: None, config=FAST_GROUP, metrics_port=port)
    consumer.start()
    try:
        samples = scrape(port)
    finally:
        consumer.close()
    labels = (("group", group), ("runtime", "consumer"))
    assert samples[("redrive_paused_partitions", labels)] == 0
