"""`redrive stats` against counted truth: a scripted workload leaves known numbers of records
waiting in the main topic, the retry topic (held until due) and the dead-letter topic."""

from __future__ import annotations

import time
from collections.abc import Callable

from click.testing import Result

from redrive import kafka, topics
from redrive.consumer import RetryingConsumer
from redrive.ops import stats
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from ..consumer.conftest import FAST_GROUP, Running, wait_until
from .conftest import produce_records, run_cli

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]
HOUR_MS = 3_600_000


class Later(Exception):
    pass


class Never(ValueError):
    pass


def test_stats_match_a_scripted_workload(bootstrap: str, new_topic: NewTopic,
                                         unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("stats")
    policy = RetryPolicy(backoff=Backoff.fixed("1h"), attempts=2, not_retryable=Never)

    def handler(record: Record) -> None:
        if (record.value or b"").startswith(b"later"):
            raise Later("try again in an hour")
        if (record.value or b"").startswith(b"never"):
            raise Never("bad record")

    values = [b"ok-0", b"later-0", b"ok-1", b"never-0", b"later-1", b"ok-2", b"ok-3",
              b"never-1", b"later-2", b"ok-4"]
    for index, value in enumerate(values):
        produce_records(bootstrap, topic, [(None, value, [])], partition=index % 2)
    started_ms = time.time_ns() // 1_000_000
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 5
               and run.total("redrive_retried_total") == 3
               and run.total("redrive_dead_lettered_total") == 2, 30, "the workload routed")
    run.stop()
    failed_by_ms = time.time_ns() // 1_000_000
    produce_records(bootstrap, topic, [(None, b"unread", [])] * 3, partition=0)
    produce_records(bootstrap, topic, [(None, b"unread", [])], partition=1)

    # Two samples with a known number of records appended between them.
    retry_topic, dlt = f"{topic}.{group}.retry.1h", f"{topic}.{group}.dlt"
    counts = kafka.topic_partitions(kafka.admin(bootstrap))
    layout = stats.roles(counts, topic, group)
    assert layout == stats.Roles(topic, (retry_topic,), dlt)
    offsets_reader = kafka.consumer(bootstrap, group)
    try:
        first = stats.snapshot(offsets_reader, layout, counts)
        produce_records(bootstrap, topic, [(None, b"late", [])] * 2, partition=1)
        second = stats.snapshot(offsets_reader, layout, counts)
    finally:
        offsets_reader.close()
    main, retry, dead = stats.summarize(layout, first, second, stats.heads(bootstrap, second))

    assert (main.waiting, main.lag, main.appended, main.consumed) == (6, 6, 2, 0)
    assert main.oldest_ms is not None and failed_by_ms <= main.oldest_ms
    assert main.next_due_ms is None
    # The consumer held the retry topic at its first record: nothing committed there.
    assert (retry.waiting, retry.lag, retry.appended) == (3, None, 0)
    assert retry.oldest_ms is not None and started_ms <= retry.oldest_ms <= failed_by_ms
    assert retry.next_due_ms is not None
    assert started_ms + HOUR_MS <= retry.next_due_ms <= failed_by_ms + HOUR_MS
    assert (dead.waiting, dead.lag, dead.consumed) == (2, None, None)
    assert dead.oldest_ms is not None and started_ms <= dead.oldest_ms <= failed_by_ms

    result = run_cli("stats", "-b", bootstrap, "--topic", topic, "--group", group,
                     "--window", "0")
    assert result.exit_code == 0, result.output
    table = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:]}
    assert table[topic][:3] == ["main", "6", "6"]
    assert table[retry_topic][:3] == ["retry", "3", "-"]
    assert table[retry_topic][4] == "in" and table[retry_topic][5].startswith("59m")
    assert table[dlt][:3] == ["dead-letter", "2", "-"]
    # Kafka's 7 days of retention: the oldest dead letter goes in a little under that.
    assert table[dlt][4:7] == ["-", "in", "6d23h"]
    assert table[retry_topic][6:8] == ["in", "6d23h"]
    planned = run_cli("stats", "-b", bootstrap, "--topic", topic, "--group", group,
                      "--backoff", "1h", "--attempts", "2", "--window", "200ms")
    assert planned.exit_code == 0, planned.output
    assert retry_topic in planned.stdout


def test_a_transactional_group_that_handled_everything_has_nothing_waiting(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    """Its copies end each transaction with a commit marker past the last record, one offset
    that offsets alone would count as a record waiting in every retry partition."""
    topic, group = new_topic(partitions=2), unique_name("stats-tx")
    seen: set[bytes] = set()

    def fail_once(record: Record) -> None:
        if record.value not in seen:
            seen.add(record.value or b"")
            raise Later("once")

    produce_records(bootstrap, topic, [(None, b"r-%d" % i, []) for i in range(6)])
    run = running(RetryingConsumer(bootstrap, topic, group,
                                   RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=2),
                                   fail_once, transactional=True, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_processed_total") == 6, 30, "every retry handled")
    run.stop()
    retry_topic = f"{topic}.{group}.retry.200ms"
    found = {s.topic: s for s in stats.collect(bootstrap, topic, group)}
    offsets_reader = kafka.consumer(bootstrap, group)
    try:
        ends = [kafka.watermarks(offsets_reader, retry_topic, p)[1] for p in range(2)]
    finally:
        offsets_reader.close()
    assert sum(ends) > 6  # six copies, and the markers after them
    assert (found[retry_topic].waiting, found[retry_topic].lag) == (0, 0)
    assert (found[topic].waiting, found[topic].lag) == (0, 0)


def roles_listed(result: Result) -> dict[str, str]:
    """Each topic of the `stats` table with its role, in the table's order."""
    assert result.exit_code == 0, result.output
    return {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:]}


def test_stats_of_an_exponential_policy_without_a_dead_letter_topic(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("exp-stats")
    policy = RetryPolicy(backoff=Backoff.exponential("1s", 3, "5s"), attempts=5,
                         dead_letter=False)
    plan = topics.plan(policy, topic, group)
    admin = kafka.admin(bootstrap)
    topics.ensure_topics(admin, plan)
    # Left over from an earlier policy of the group: on the cluster, but not the group's now.
    stale_retry, stale_dlt = f"{topic}.{group}.retry.1h", f"{topic}.{group}.dlt"
    kafka.create_topics(admin, {stale_retry: 1, stale_dlt: 1})
    base = ["stats", "-b", bootstrap, "--topic", topic, "--group", group, "--window", "0"]

    found = roles_listed(run_cli(*base))
    assert stale_retry in found and found[stale_dlt] == "dead-letter"
    planned = roles_listed(run_cli(*base, "--exponential", "1s", "--multiplier", "3",
                                   "--max-delay", "5s", "--attempts", "5", "--no-dlt"))
    assert plan.retry_topic_names == [f"{topic}.{group}.retry.{d}" for d in ("1s", "3s", "5s")]
    assert planned == {topic: "main", **{name: "retry" for name in plan.retry_topic_names}}
    assert list(planned) == [topic, *plan.retry_topic_names]


def test_stats_of_a_group_with_nothing_on_the_topic_says_so(bootstrap: str, new_topic: NewTopic,
                                                            unique_name: UniqueName) -> None:
    topic = new_topic()
    produce_records(bootstrap, topic, [(None, b"v", [])] * 3)
    typo = run_cli("stats", "-b", bootstrap, "--topic", topic, "--group", unique_name("typo"),
                   "--window", "0")
    assert typo.exit_code == 0, typo.output
    assert roles_listed(typo) == {topic: "main"}
    assert typo.stderr.startswith("note: group ")
    assert f"has committed nothing on {topic} and has no retry or dead-letter topics" in \
        typo.stderr
