"""`redrive topics plan|create`: the retry and dead-letter topics a policy needs."""

from __future__ import annotations

import sys
from typing import Any

import click
from confluent_kafka.admin import AdminClient

from redrive import kafka, retention, topics
from redrive.backends.delay_queue import own_topics
from redrive.cli.formatting import table
from redrive.cli.options import (
    connection_options,
    policy_from_options,
    policy_options,
    with_options,
)
from redrive.delay.tiers import DEFAULT_PREFIX, Tiers
from redrive.policy import format_ms

_topic_and_group = with_options([
    click.option("--topic", required=True, help="The main topic the group consumes."),
    click.option("--group", required=True, help="Consumer group id or Spark pipeline name."),
])


@click.group("topics")
def topics_group() -> None:
    """Plan and create the retry and dead-letter topics of a group."""


def _plan_rows(plan: topics.TopicPlan, spark: bool) -> list[list[object]]:
    rows: list[list[object]] = [[plan.topic, "main", "", "first delivery"]]
    for retry_topic in plan.retry_topics:
        served = ", ".join(str(r + 1) for r in retry_topic.retries)
        rows.append([retry_topic.name, "retry", retry_topic.delay, f"attempts {served}"])
    if plan.dead_letter:
        rows.append([plan.dead_letter, "dead-letter", "", "after the last attempt"])
    if spark:
        rows.append([topics.pipeline_ledger_name(plan.group), "batch ledger", "",
                     "each micro-batch's routing and report (1 partition)"])
    return rows


def _delay_queue_rows(plan: topics.TopicPlan, tiers: Tiers, spark: bool) -> list[list[object]]:
    rows: list[list[object]] = [[plan.topic, "main", "",
                                 f"first delivery, and {plan.group}'s retries when due"]]
    rows += [[tier.topic, "delay tier (shared)", format_ms(tier.delay_ms),
              "every group's waiting retries"] for tier in tiers.tiers]
    rows.append([tiers.dead_letter, "delay dead-letter (shared)", "",
                 "copies whose target cannot be read"])
    return rows + _plan_rows(own_topics(plan), spark)[1:]


@topics_group.command("plan")
@_topic_and_group
@policy_options
@click.option("--spark", is_flag=True,
              help="The group is a RetryPipeline: show its batch ledger topic too.")
@click.option("--delay-queue", "delay_tiers", default=None, metavar="TIERS",
              help="The group retries through the delay service's tiers (retry_backend="
                   "DelayQueue), such as 1s,10s,1m,10m,1h: no retry topics of its own.")
@click.option("--delay-prefix", default=DEFAULT_PREFIX, show_default=True,
              help="The delay service's topic prefix, with --delay-queue.")
def topics_plan(topic: str, group: str, spark: bool, delay_tiers: str | None,
                delay_prefix: str, **policy_args: Any) -> None:
    """Print the topics a policy needs, with each retry topic's delay and the attempts it serves."""
    policy = policy_from_options(**policy_args)
    plan = topics.plan(policy, topic, group)
    if delay_tiers is None:
        rows = _plan_rows(plan, spark)
    else:
        rows = _delay_queue_rows(plan, Tiers.parse(delay_tiers, delay_prefix), spark)
    click.echo(table(["topic", "role", "delay", "serves"], rows))
    click.echo(f"\npolicy: {policy.describe()}")
    if delay_tiers is not None:
        delays = ", ".join(format_ms(ms) for ms in policy.retry_delays_ms())
        click.echo(f"retries wait {delays} in the tiers, then return to {topic}")


def _replication_factor(value: int) -> int:
    if value == 0:  # IntRange(min=-1) lets it through; the broker would refuse every topic
        raise click.BadParameter("must be -1 (the broker's default) or at least 1")
    return value


@topics_group.command("create")
@_topic_and_group
@policy_options
@connection_options
@click.option("--partitions", type=int, default=None,
              help="Partitions of new topics (default: as many as the main topic).")
@click.option("--replication-factor", type=click.IntRange(min=-1), default=-1,
              callback=lambda _ctx, _param, value: _replication_factor(value),
              help="Replication factor of new topics: -1 (the broker's default) or at least 1.")
def topics_create(topic: str, group: str, connection: dict[str, str], partitions: int | None,
                  replication_factor: int, **policy_args: Any) -> None:
    """Create the plan's missing topics and report those whose partitions are too few; fail
    when a retry topic would delete or compact copies before they are due."""
    policy = policy_from_options(**policy_args)
    plan = topics.plan(policy, topic, group)
    admin = kafka.admin(connection)
    report = topics.ensure_topics(admin, plan, partitions=partitions,
                                  replication_factor=replication_factor)
    rows = [[name, "created" if name in report.created else "exists"]
            for name in plan.created_topics]
    click.echo(table(["topic", "status"], rows))
    for mismatch in report.mismatched:
        click.echo(f"warning: {mismatch}", err=True)
    compacted = _compacted_dead_letters(admin, plan)
    retention.check(admin, plan.waits)
    if compacted:
        sys.exit(2)


def _compacted_dead_letters(admin: AdminClient, plan: topics.TopicPlan) -> bool:
    """Report a dead-letter topic that compacts: of two dead letters with one key, compaction
    would keep only the later one, and nothing would tell the first was lost."""
    if not plan.dead_letter:
        return False
    kept = kafka.keeping(admin, [plan.dead_letter]).get(plan.dead_letter)
    if kept is None or not kept.compacts:
        return False
    click.echo(f"error: dead-letter topic {plan.dead_letter!r} has cleanup.policy=compact: "
               "compaction keeps only the last record of each key, so a dead letter would be "
               "removed once a later one with its key arrives. Set cleanup.policy=delete on "
               f"{plan.dead_letter!r}", err=True)
    return True
