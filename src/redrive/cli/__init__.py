"""The `redrive` command: one click group, each concern's commands in a module of this room."""

from __future__ import annotations

import sys
from typing import Any

import click

from redrive.cli.console import ui_command
from redrive.cli.delay import delay_command
from redrive.cli.dev import dev_broker
from redrive.cli.ops import dlt, resume_command, stats_command
from redrive.cli.store import store_command
from redrive.cli.topics import topics_group
from redrive.errors import RedriveError


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


for command in (topics_group, delay_command, dlt, stats_command, resume_command, store_command,
                ui_command, dev_broker):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="redrive")
