"""`redrive topics plan|create`: the retry and dead-letter topics a policy needs."""

from __future__ import annotations

from typing import Any

import click

from redrive import kafka, topics
from redrive.cli.formatting import table
from redrive.cli.options import bootstrap_option, policy_from_options, policy_options, with_options

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


@topics_group.command("plan")
@_topic_and_group
@policy_options
@click.option("--spark", is_flag=True,
              help="The group is a RetryPipeline: show its batch ledger topic too.")
def topics_plan(topic: str, group: str, spark: bool, **policy_args: Any) -> None:
    """Print the topics a policy needs, with each retry topic's delay and the attempts it serves."""
    policy = policy_from_options(**policy_args)
    plan = topics.plan(policy, topic, group)
    click.echo(table(["topic", "role", "delay", "serves"], _plan_rows(plan, spark)))
    click.echo(f"\npolicy: {policy.describe()}")


@topics_group.command("create")
@_topic_and_group
@policy_options
@bootstrap_option
@click.option("--partitions", type=int, default=None,
              help="Partitions of new topics (default: as many as the main topic).")
@click.option("--replication-factor", type=int, default=-1,
              help="Replication factor of new topics (default: the broker's).")
def topics_create(topic: str, group: str, bootstrap: str, partitions: int | None,
                  replication_factor: int, **policy_args: Any) -> None:
    """Create the plan's missing topics and report those whose partitions are too few."""
    policy = policy_from_options(**policy_args)
    plan = topics.plan(policy, topic, group)
    report = topics.ensure_topics(kafka.admin(bootstrap), plan, partitions=partitions,
                                  replication_factor=replication_factor)
    rows = [[name, "created" if name in report.created else "exists"]
            for name in plan.created_topics]
    click.echo(table(["topic", "status"], rows))
    for mismatch in report.mismatched:
        click.echo(f"warning: {mismatch}", err=True)
