"""In-place retries, the group filter, and the metrics endpoint, on noida-db."""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from redrive import headers as h
from redrive.consumer import RetryingConsumer
from redrive.dev.ports import free_port
from redrive.policy import Backoff, InPlace, RetryPolicy
from redrive.record import Record

from .conftest import FAST_GROUP, Handled, Running, committed, produce, read_all, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


def test_in_place_retry_then_success_keeps_partition_order(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("inplace")
    policy = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=2,
                         in_place=InPlace(on=TimeoutError, retries=3,
                                          backoff=Backoff.fixed("200ms")))
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"flaky" and seen.count(b"flaky") <= 2:
            raise TimeoutError("upstream slow")

    produce(bootstrap, topic, [b"before", b"flaky", b"after1", b"after2"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 4, 20, "4 processed")
    run.stop()

    # The partition waited for the flaky record: nothing behind it went first.
    assert seen.values() == [b"before", b"flaky", b"flaky", b"flaky", b"after1", b"after2"]
    tries = [at for record, at in seen.calls if record.value == b"flaky"]
    assert all(later - earlier >= 200 for earlier, later in itertools.pairwise(tries))
    # Resumed, the partition is fetched at once, not at librdkafka's next one-second tick
    # (about 1,000 ms apart before).
    assert all(later - earlier < 800 for earlier, later in itertools.pairwise(tries)), tries
    assert run.consumer.metrics.value("redrive_in_place_retries_total", topic=topic) == 2
    assert run.total("redrive_retried_total") == 0
    assert all(record.delivery.attempt == 0 for record, _ in seen.calls)
    assert committed(bootstrap, group, topic) == {0: 4}


def test_in_place_budget_spent_then_routed_non_blocking(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("inplace-out")
    policy = RetryPolicy(backoff=Backoff.fixed("300ms"), attempts=2,
                         in_place=InPlace(on=TimeoutError, retries=2,
                                          backoff=Backoff.fixed("100ms")))
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)
        if record.value == b"down":
            raise TimeoutError("still down")

    produce(bootstrap, topic, [b"down", b"next"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 1, 20, "the dead letter")
    run.stop()

    attempts = [record.delivery.attempt for record, _ in seen.calls if record.value == b"down"]
    # Three tries on the main topic (1 + 2 in place), then three on the retry topic.
    assert attempts == [0, 0, 0, 1, 1, 1]
    metrics = run.consumer.metrics
    assert metrics.value("redrive_in_place_retries_total", topic=topic) == 4
    assert metrics.value("redrive_retried_total", topic=topic, attempt="1") == 1
    assert metrics.value("redrive_dead_lettered_total", topic=topic, reason="exhausted") == 1
    assert metrics.value("redrive_processed_total", topic=topic) == 1
    dead = read_all(bootstrap, f"{topic}.{group}.dlt", expect=1)
    assert dead[0].header(h.ATTEMPT) == "2" and dead[0].header(h.REASON) == "exhausted"


def test_records_of_another_group_are_skipped_and_committed(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("mine")
    seen = Handled()
    produce(bootstrap, topic, [b"fresh"])
    produce(bootstrap, topic, [b"theirs"], headers=[(h.GROUP, b"someone-else"),
                                                    (h.ATTEMPT, b"1")])
    produce(bootstrap, topic, [b"ours"], headers=[(h.GROUP, group.encode()), (h.ATTEMPT, b"1")])
    # Another group's copy with a header no one can read is that group's to dead-letter.
    produce(bootstrap, topic, [b"theirs-unreadable"], headers=[(h.GROUP, b"someone-else"),
                                                               (h.ATTEMPT, b"many")])
    run = running(RetryingConsumer(bootstrap, topic, group, RetryPolicy(), seen.add,
                                   config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 2
               and run.total("redrive_skipped_total") == 2, 20, "2 processed, 2 skipped")
    run.stop()
    assert seen.values() == [b"fresh", b"ours"]
    assert [r.delivery.attempt for r, _ in seen.calls] == [0, 1]
    assert run.consumer.metrics.value("redrive_skipped_total", topic=topic,
                                      why="other-group") == 2
    assert run.total("redrive_dead_lettered_total") == 0
    assert committed(bootstrap, group, topic) == {0: 4}


def test_metrics_endpoint_shows_the_counts(bootstrap: str, new_topic: NewTopic,
                                           unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("scrape")
    port = free_port()
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=2)

    def handler(record: Record) -> None:
        if record.value == b"fail":
            raise RuntimeError("no")

    produce(bootstrap, topic, [b"a", b"fail", b"b"])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP,
                                   metrics_port=port))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 1, 20, "the dead letter")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    run.stop()
    samples = {(s.name, s.labels.get("attempt") or s.labels.get("reason") or ""): s.value
               for family in text_string_to_metric_families(text) for s in family.samples
               if s.labels.get("group") == group and s.labels.get("runtime") == "consumer"}
    assert samples[("redrive_processed_total", "")] == 2
    assert samples[("redrive_retried_total", "1")] == 1
    assert samples[("redrive_dead_lettered_total", "exhausted")] == 1
    assert samples[("redrive_rebalances_total", "")] >= 1
