"""`redrive delay run`: one instance of the delay service, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging

import click

from redrive.cli.options import SETTING, connection_options, metrics_port_option, settings
from redrive.delay.own_topics import DEFAULT_PARTITIONS
from redrive.delay.service import DEFAULT_GROUP, DelayService
from redrive.delay.tiers import DEFAULT_DURATIONS, DEFAULT_PREFIX, Tiers
from redrive.errors import RedriveError


@click.group("delay")
def delay_command() -> None:
    """The delay queue: deliver scheduled records to their target topic when due."""


@delay_command.command("run")
@connection_options
@click.option("--tiers", default=",".join(DEFAULT_DURATIONS), show_default=True,
              help="Delay tiers, comma-separated; the smallest bounds the lateness.")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True,
              help="Tier topics are PREFIX.<tier>, the dead-letter topic PREFIX.dlt.")
@click.option("--group", default=DEFAULT_GROUP, show_default=True,
              help="Consumer group the instances share.")
@click.option("--instance-id", default=None, envvar="REDRIVE_INSTANCE_ID",
              help="Stable name of this instance (e.g. the pod name): static group membership "
                   "and transactional id, for fast and exactly-once restarts.")
@click.option("--partitions", type=int, default=DEFAULT_PARTITIONS, show_default=True,
              help="Partitions of tier topics created at start.")
@click.option("--at-least-once", is_flag=True,
              help="Forward without transactions (a crash may duplicate records).")
@metrics_port_option
@click.option("--consumer-config", type=SETTING, multiple=True,
              help="A librdkafka setting for the consumer only; repeatable.")
@click.option("--producer-config", type=SETTING, multiple=True,
              help="A librdkafka setting for the producer only; repeatable.")
def run_command(connection: dict[str, str], tiers: str, prefix: str, group: str,
                instance_id: str | None, partitions: int, at_least_once: bool,
                metrics_port: int | None,
                consumer_config: tuple[tuple[str, str], ...],
                producer_config: tuple[tuple[str, str], ...]) -> None:
    """Run one instance of the delay service until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        service = DelayService(connection, Tiers.parse(tiers, prefix),
                               transactional=not at_least_once, instance_id=instance_id,
                               metrics_port=metrics_port, group_id=group, partitions=partitions,
                               consumer_overrides=settings(consumer_config),
                               producer_overrides=settings(producer_config))
        service.run()
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped after forwarding {service.metrics.total('redrive_forwarded_total'):.0f} "
               "record(s)")
