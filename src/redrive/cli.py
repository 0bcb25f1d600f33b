"""The `redrive` command."""

from __future__ import annotations

import sys
from typing import Any

import click

from redrive import kafka, topics
from redrive.delay.command import delay_command
from redrive.errors import RedriveError
from redrive.ops_cli import dlt, stats_command
from redrive.policy_options import policy_from_options, policy_options
from redrive.store.command import store_command
from redrive.table import render


class _Group(click.Group):
    """Turn redrive's own errors into one clear line and exit status 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RedriveError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="redrive")
def cli() -> None:
    """Non-blocking retries, delay queues and dead-letter topics for Kafka."""


def _plan_rows(plan: topics.TopicPlan) -> list[list[object]]:
    rows: list[list[object]] = [[plan.topic, "main", "", "first delivery"]]
    for retry_topic in plan.retry_topics:
        served = ", ".join(str(r + 1) for r in retry_topic.retries)
        rows.append([retry_topic.name, "retry", retry_topic.delay, f"attempts {served}"])
    if plan.dead_letter:
        rows.append([plan.dead_letter, "dead-letter", "", "after the last attempt"])
    return rows


@cli.group("topics")
def topics_group() -> None:
    """Plan and create the retry and dead-letter topics of a group."""


def _required_topic_and_group(function: Any) -> Any:
    options = [
        click.option("--topic", required=True, help="The main topic the group consumes."),
        click.option("--group", required=True, help="Consumer group id or Spark pipeline name."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@topics_group.command("plan")
@_required_topic_and_group
@policy_options
def topics_plan(topic: str, group: str, **policy_args: Any) -> None:
    """Print the topics a policy needs, with each retry topic's delay and the attempts it serves."""
    policy = policy_from_options(**policy_args)
    plan = topics.plan(policy, topic, group)
    click.echo(render(["topic", "role", "delay", "serves"], _plan_rows(plan)))
    click.echo(f"\npolicy: {policy.describe()}")


@topics_group.command("create")
@_required_topic_and_group
@policy_options
@click.option("--bootstrap", "-b", required=True, envvar="REDRIVE_BOOTSTRAP",
              help="Kafka bootstrap servers (host:port).")
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
    click.echo(render(["topic", "status"], rows))
    for mismatch in report.mismatched:
        click.echo(f"warning: {mismatch}", err=True)


@cli.command("dev-broker")
@click.option("--kind", type=click.Choice(["noida-db", "tansu"]), default="noida-db",
              show_default=True)
@click.option("--port", type=int, default=9092, show_default=True)
@click.option("--data-dir", default=None,
              help="Where noida-db keeps its data [default: .redrive/dev-broker/KIND]; Tansu "
                   "keeps everything in memory.")
def dev_broker(kind: str, port: int, data_dir: str | None) -> None:
    """Run a development broker in the foreground (for trying redrive; not for production)."""
    from redrive import devbroker

    try:
        devbroker.serve(kind, port, data_dir)
    except (devbroker.DevBrokerError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


cli.add_command(delay_command)
cli.add_command(dlt)
cli.add_command(stats_command)
cli.add_command(store_command)


def main() -> None:
    cli(prog_name="redrive")
