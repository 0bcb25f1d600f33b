"""A policy's topic plan created on a real broker, and a routed retry copy as kcat sees it."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from redrive import headers as h
from redrive import kafka, topics
from redrive.cli import cli
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.routing import Retry, route

from .records import produce_input
from .test_kcat import kcat_consume

SEED = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m,30m,30m,1h"))


def test_ensure_topics_creates_the_plan_with_the_source_partitions(
        bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    source = new_topic(partitions=3)
    plan = topics.plan(SEED, source, unique_name("billing"))
    admin = kafka.admin(bootstrap)
    report = topics.ensure_topics(admin, plan)
    assert sorted(report.created) == sorted(plan.created_topics)
    assert report.mismatched == ()
    counts = kafka.topic_partitions(admin)
    assert [counts[name] for name in plan.created_topics] == [3, 3, 3, 3]
    again = topics.ensure_topics(admin, plan)
    assert again.created == () and sorted(again.existing) == sorted(plan.created_topics)


def test_existing_topics_with_too_few_partitions_are_reported(
        bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    source = new_topic(partitions=4)
    plan = topics.plan(SEED, source, unique_name("billing"))
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {plan.retry_topics[0].name: 1})
    report = topics.ensure_topics(admin, plan)
    assert [(m.topic, m.partitions, m.needed) for m in report.mismatched] == \
        [(plan.retry_topics[0].name, 1, 4)]
    assert plan.retry_topics[0].name not in report.created


def test_the_plan_takes_the_source_topics_record_limit_and_smaller_ones_are_reported(
        bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    """A copy is the record plus headers: where the source topic was set to take large records,
    the plan's new topics are too, and an existing topic or a client that would refuse them is
    reported."""
    source = new_topic(partitions=2, config={"max.message.bytes": "2000000"})
    admin = kafka.admin(bootstrap)
    plan = topics.plan(SEED, source, unique_name("billing"))
    old = new_topic(partitions=2, name=plan.retry_topics[0].name)  # the cluster's default limit
    report = topics.ensure_topics(admin, plan)
    default = kafka.record_limits(admin, [old])[old]
    assert not default.own and default.bytes < 2_000_000
    assert report.mismatched == (
        topics.SmallerLimit(old, default.bytes, 2_000_000),
        topics.SmallerLimit(source, 1_000_000, 2_000_000, client=True))
    assert f"{old} takes records up to {default.bytes:,} bytes (max.message.bytes), fewer " \
        "than the 2,000,000 of its source topic" in str(report.mismatched[0])
    limits = kafka.record_limits(admin, list(report.created))
    assert sorted(report.created) == sorted(set(plan.created_topics) - {old})
    assert {name: (limit.bytes, limit.own) for name, limit in limits.items()} == \
        {name: (2_000_000, True) for name in report.created}
    # A connection whose producer takes such records is not reported.
    roomy = topics.ensure_topics(kafka.admin_beside(bootstrap, {"message.max.bytes": 3_000_000}),
                                 plan)
    assert roomy.mismatched == (topics.SmallerLimit(old, default.bytes, 2_000_000),)
    # A source set below the default does not lower the plan's new topics.
    small = new_topic(config={"max.message.bytes": "500000"})
    created = topics.ensure_topics(admin, topics.plan(SEED, small, unique_name("billing")))
    assert created.mismatched == ()
    assert not any(limit.own for limit in kafka.record_limits(admin, created.created).values())


def test_topics_create_command(bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    source = new_topic(partitions=2)
    group = unique_name("cli")
    result = CliRunner().invoke(cli, ["topics", "create", "--topic", source, "--group", group,
                                      "--backoff", "1s,1s,10s", "--bootstrap", bootstrap])
    assert result.exit_code == 0, result.output
    assert result.output.count("created") == 3  # retry.1s, retry.10s, dlt
    counts = kafka.topic_partitions(kafka.admin(bootstrap))
    assert counts[f"{source}.{group}.retry.1s"] == 2
    assert counts[f"{source}.{group}.dlt"] == 2
    unknown = CliRunner().invoke(cli, ["topics", "create", "--topic", f"{source}-missing",
                                       "--group", group, "--bootstrap", bootstrap])
    assert unknown.exit_code == 2
    assert f"unknown topic '{source}-missing'" in unknown.output
    # A retry topic made beforehand that would delete the copies before they are due.
    short = unique_name("short")
    new_topic(name=f"{source}.{short}.retry.10s", partitions=2, config={"retention.ms": "9000"})
    refused = CliRunner().invoke(cli, ["topics", "create", "--topic", source, "--group", short,
                                       "--backoff", "1s,10s", "--bootstrap", bootstrap])
    assert refused.exit_code == 2
    assert refused.output.count("created") == 2  # retry.1s and dlt: the rest is made
    assert (f"topic '{source}.{short}.retry.10s' has retention.ms=9000 (9s), no longer than "
            "the 10s a record waits there") in refused.output


def test_topics_create_refuses_a_compacted_dead_letter_topic(bootstrap: str, new_topic: Any,
                                                            unique_name: Any) -> None:
    source = new_topic(partitions=2)
    group = unique_name("compacted")
    new_topic(name=f"{source}.{group}.dlt", partitions=2, config={"cleanup.policy": "compact"})
    result = CliRunner().invoke(cli, ["topics", "create", "--topic", source, "--group", group,
                                      "--backoff", "1s", "--bootstrap", bootstrap])
    assert result.exit_code == 2, result.output
    assert result.output.count("created") == 1  # retry.1s: the rest is made
    assert (f"dead-letter topic '{source}.{group}.dlt' has cleanup.policy=compact"
            in result.output)


def test_topics_create_with_a_replication_factor_the_cluster_cannot_have(
        bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    source = new_topic(partitions=1)
    group = unique_name("replicas")
    arguments = ["topics", "create", "--topic", source, "--group", group, "--backoff", "1s",
                 "--bootstrap", bootstrap, "--replication-factor"]
    zero = CliRunner().invoke(cli, [*arguments, "0"])
    assert zero.exit_code == 2
    assert "--replication-factor" in zero.output and "at least 1" in zero.output
    assert zero.exception is None or isinstance(zero.exception, SystemExit)
    # More replicas than the one broker: the broker refuses, and the error names the topic.
    many = CliRunner().invoke(cli, [*arguments, "5"])
    assert many.exit_code == 2, many.output
    assert isinstance(many.exception, SystemExit)
    assert f"error: creating topic '{source}.{group}." in many.output
    assert source + "." + group not in str(kafka.topic_partitions(kafka.admin(bootstrap)))


def test_a_routed_retry_copy_as_kcat_sees_it(bootstrap: str, new_topic: Any,
                                              unique_name: Any) -> None:
    source = new_topic(partitions=2)
    group = unique_name("billing")
    plan = topics.plan(SEED, source, group)
    topics.ensure_topics(kafka.admin(bootstrap), plan)
    failed = Record(source, 1, 17, 1_700_000_000_000, b"order-17", b'{"amount": 12}',
                    [("traceparent", b"00-abc-01")])
    now = 1_800_000_000_000
    decision = route(failed, TimeoutError("enrichment timed out"), SEED, now, group=group)
    assert isinstance(decision, Retry)
    produce_input(bootstrap, [kafka.OutRecord(
        decision.topic, failed.value, failed.key, decision.headers, decision.partition)])

    [seen] = kcat_consume(bootstrap, f"{source}.{group}.retry.5m")
    assert seen["partition"] == 1  # the source partition is kept
    assert seen["key"] == "order-17" and seen["payload"] == '{"amount": 12}'
    pairs = seen["headers"]
    by_name = dict(zip(pairs[::2], pairs[1::2], strict=True))
    assert pairs[:2] == ["traceparent", "00-abc-01"]  # the record's own header first, unchanged
    assert by_name[h.ATTEMPT] == "1"
    assert by_name[h.DUE] == str(now + 300_000)
    assert by_name[h.GROUP] == group
    assert by_name[h.FIRST_FAILURE] == str(now)
    assert (by_name[h.ORIGINAL_TOPIC], by_name[h.ORIGINAL_PARTITION],
            by_name[h.ORIGINAL_OFFSET], by_name[h.ORIGINAL_TIMESTAMP]) == \
        (source, "1", "17", "1700000000000")
    assert by_name[h.ERROR_TYPE] == "TimeoutError"
    assert by_name[h.ERROR_MESSAGE] == "enrichment timed out"
    assert h.REASON not in by_name
