"""The on-call commands: `redrive dlt ls|show|replay`, `redrive stats` and `redrive resume`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from redrive import control, kafka, topics
from redrive.cli import formatting
from redrive.cli.options import (
    Seconds,
    connection_options,
    policy_from_options,
    policy_options,
    with_options,
)
from redrive.clock import now_ms
from redrive.control import CONTROL_TOPIC, Resume, request_resume
from redrive.errors import InvalidArgument
from redrive.gc_pause import gc_paused
from redrive.ops import deadletters, stats
from redrive.ops.deadletters import DeadLetterFilter, DeadLetterRecord, Reader
from redrive.ops.replay import (
    TO_ORIGINAL,
    TO_RETRY,
    ReplayReport,
    default_actor,
    first_retry_topic,
    replay,
)
from redrive.policy import RetryPolicy, to_ms

Command = Callable[..., Any]

# librdkafka logs every failed connection attempt to stderr; an on-call engineer needs the one
# line that says the broker is unreachable, which redrive's own error gives.
_CLIENT_LOG = logging.getLogger("redrive.ops.librdkafka")
_CLIENT_LOG.addHandler(logging.NullHandler())
_CLIENT_LOG.propagate = False


def _connect(connection: dict[str, str]) -> kafka.Connection:
    return {**connection, "logger": _CLIENT_LOG}


_connection_options = with_options([
    connection_options,
    click.option("--timeout", "timeout_s", type=Seconds(most=3600),
                 default=10.0, show_default=True,
                 help="Seconds to wait for the broker before giving up."),
])

_dlt_options = with_options([
    click.option("--topic", default=None, help="The group's main topic (with --group)."),
    click.option("--group", default=None, help="The consumer group or pipeline name."),
    click.option("--dlt-topic", default=None,
                 help="Any dead-letter topic, instead of --topic/--group."),
])

_filter_options = with_options([
    click.option("--reason", "reasons", multiple=True,
                 help="exhausted, not-retryable, deadline or malformed (repeatable)."),
    click.option("--error-type", "error_types", multiple=True,
                 help="Error class, full or last dotted part (repeatable)."),
    click.option("--since", default=None, help="Dead-lettered after: 2h (ago) or ISO time."),
    click.option("--until", default=None, help="Dead-lettered before: 30m (ago) or ISO time."),
    click.option("--key", "keys", multiple=True, help="Record key, as text (repeatable)."),
    click.option("--header", "header_matches", multiple=True, metavar="NAME=VALUE",
                 help="Header value to match (repeatable; all must match)."),
    click.option("--partition", "partitions", type=int, multiple=True,
                 help="Only these partitions of the dead-letter topic (repeatable)."),
])


def _dlt_topic(topic: str | None, group: str | None, dlt_topic: str | None) -> str:
    if dlt_topic is not None:
        if topic is not None:
            raise click.UsageError("give --dlt-topic or --topic/--group, not both")
        return topics.check_name("dlt-topic", dlt_topic)
    if topic is None or group is None:
        raise click.UsageError("give --topic and --group, or --dlt-topic")
    return deadletters.dead_letter_topic(topic, group)


def _filter(reasons: Sequence[str], error_types: Sequence[str], since: str | None,
            until: str | None, keys: Sequence[str], header_matches: Sequence[str],
            partitions: Sequence[int]) -> DeadLetterFilter:
    return deadletters.make_filter(reasons=reasons, error_types=error_types, since=since,
                                   until=until, keys=keys, headers=header_matches,
                                   partitions=partitions)


@click.group("dlt")
def dlt() -> None:
    """Inspect and replay dead-letter records (redrive's, Spring's, Connect's, Streams', share
    groups', Karafka's)."""


@dlt.command("ls")
@_connection_options
@_dlt_options
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Show at most this many records.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array instead of a table.")
# 100,000 dead letters listed in 5.9 s without the collector, 8.7 s with it (medians of three).
@gc_paused()
def dlt_ls(connection: dict[str, str], timeout_s: float, topic: str | None, group: str | None,
           dlt_topic: str | None, limit: int | None, as_json: bool, **filters: Any) -> None:
    """List dead-letter records: key, age, reason, error, attempts, where each came from."""
    name = _dlt_topic(topic, group, dlt_topic)
    selection = _filter(**filters)
    found: list[DeadLetterRecord] = []
    for record in Reader(_connect(connection), name, timeout_s).records(selection):
        found.append(record)
        if limit is not None and len(found) >= limit:
            break
    at = now_ms()
    if as_json:
        click.echo(json.dumps([record.to_json(at) for record in found], indent=2))
        return
    click.echo(formatting.table(formatting.SUMMARY_COLUMNS,
                                [formatting.summary_row(record, at) for record in found]))
    unreadable = sum(1 for record in found if record.problem)
    click.echo(f"\n{len(found)} record(s) in {name}"
               + (f", {unreadable} with unreadable headers" if unreadable else ""))


@dlt.command("show")
@_connection_options
@_dlt_options
@click.argument("record")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def dlt_show(connection: dict[str, str], timeout_s: float, topic: str | None, group: str | None,
             dlt_topic: str | None, record: str, as_json: bool) -> None:
    """Show one record (PARTITION:OFFSET, as `dlt ls` prints it) with all headers and trace."""
    name = _dlt_topic(topic, group, dlt_topic)
    partition, offset = deadletters.parse_coordinates(record)
    found = Reader(_connect(connection), name, timeout_s).one(partition, offset)
    at = now_ms()
    if as_json:
        click.echo(json.dumps(found.to_json(at, full=True), indent=2))
    else:
        click.echo(formatting.detail(found, at))


def _group_policy(backoff: str | None, exponential: str | None, multiplier: float | None,
                  max_delay: str | None, attempts: int | None, naming: str,
                  no_dlt: bool) -> RetryPolicy | None:
    """The group's policy as the options give it, or None to find its topics on the cluster."""
    # --naming and --no-dlt alone give no delays: a policy made of them would have the default
    # 1s ones, and so name topics the group likely does not have. --multiplier and --max-delay
    # alone are refused below, as everywhere, rather than ignored.
    shaped = multiplier is not None or max_delay is not None
    if backoff is None and exponential is None and attempts is None and not shaped:
        return None
    return policy_from_options(backoff=backoff, exponential=exponential, multiplier=multiplier,
                               max_delay=max_delay, attempts=attempts, naming=naming,
                               no_dlt=no_dlt)


def _replay_destination(connection: dict[str, str], timeout_s: float, topic: str | None,
                        group: str | None, to: str, to_topic: str | None,
                        policy: RetryPolicy | None) -> str | None:
    """The first retry topic: named, planned from a policy, or the only one on the cluster."""
    if to == TO_ORIGINAL:
        if to_topic or policy is not None:
            raise click.UsageError("--to original takes no --to-topic, --backoff, --exponential "
                                   "or --attempts")
        return None
    if to_topic is not None:
        return to_topic
    if topic is None or group is None:
        raise click.UsageError("replay to the retry topic needs --topic and --group "
                               "(or --to-topic)")
    if policy is not None:
        return first_retry_topic(policy, topic, group)
    existing = kafka.topic_partitions(kafka.admin(_connect(connection)), timeout_s)
    found = stats.discover_retry_topics(existing, topic, group)
    first_by_attempt = topics.retry_topic_name(topic, group, "1")
    if first_by_attempt in found:
        return first_by_attempt
    if len(found) == 1:
        return found[0]
    if not found:
        raise InvalidArgument("topic", topic, f"group {group!r} has no retry topic on the "
                              "cluster; give --to-topic")
    raise click.UsageError(f"which retry topic is group {group}'s first is not known: "
                           f"{len(found)} retry topics exist ({', '.join(found)}); give the "
                           "group's policy (--backoff or --exponential, and --attempts), or "
                           "--to-topic")


@dlt.command("replay")
@_connection_options
@_dlt_options
@_filter_options
@click.option("--record", "records", multiple=True, metavar="PARTITION:OFFSET",
              help="Only these records (repeatable).")
@click.option("--to", type=click.Choice([TO_RETRY, TO_ORIGINAL]), default=TO_RETRY,
              show_default=True, help="The group's first retry topic, or each record's original.")
@click.option("--to-topic", default=None, help="The first retry topic, named explicitly.")
@policy_options
@click.option("--keep-attempts", is_flag=True,
              help="Keep the attempt count and first failure time (default: start over).")
@click.option("--dry-run", is_flag=True, help="Show what would be published; publish nothing.")
@click.option("--rate", default=None, metavar="N/s", help="Publish at most this fast.")
@click.option("--actor", default=None, help="Who replays, for the audit log (user@host).")
@click.option("--again", is_flag=True, help="Also records replayed before (each replay stays in "
              "the record's history in the log).")
def dlt_replay(connection: dict[str, str], timeout_s: float, topic: str | None, group: str | None,
               dlt_topic: str | None, records: Sequence[str], to: str, to_topic: str | None,
               backoff: str | None, exponential: str | None, multiplier: float,
               max_delay: str | None, attempts: int | None, naming: str, no_dlt: bool,
               keep_attempts: bool, dry_run: bool, rate: str | None, actor: str | None,
               again: bool, **filters: Any) -> None:
    """Republish dead-letter records, each once (unless --again): replays are logged in
    redrive.replays.

    The first retry topic is planned from the group's policy if given (as in `topics plan`),
    else found on the cluster. Exits with status 1 when a selected record was (or, with
    --dry-run, would be) skipped, so that a script notices what it must look at.
    """
    name = _dlt_topic(topic, group, dlt_topic)
    selection = _filter(**filters)
    if records:
        wanted = frozenset(deadletters.parse_coordinates(r) for r in records)
        selection = dataclasses.replace(selection, coordinates=wanted)
    policy = _group_policy(backoff=backoff, exponential=exponential, multiplier=multiplier,
                           max_delay=max_delay, attempts=attempts, naming=naming, no_dlt=no_dlt)
    destination = _replay_destination(connection, timeout_s, topic, group, to, to_topic, policy)
    with contextlib.ExitStack() as stack:
        bar = _LazyBar(stack, "checking" if dry_run else "replaying")
        report = replay(_connect(connection), name, to_topic=destination, to=to, group=group,
                        keep_attempts=keep_attempts, selection=selection, dry_run=dry_run,
                        rate=rate, actor=actor, again=again, progress=bar.advance,
                        timeout_s=timeout_s)
    _print_report(report, name)
    if report.skipped:
        sys.exit(1)


class _LazyBar:
    """A progress bar on stderr, made once the replay knows how many records it selected; none
    where stderr is not a terminal (click would print its bare label there, once)."""

    def __init__(self, stack: contextlib.ExitStack, label: str) -> None:
        self._stack = stack
        self._label = label
        self._bar: Any = None  # click's ProgressBar, whose class click does not export

    def advance(self, count: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if self._bar is None:
            self._bar = self._stack.enter_context(click.progressbar(
                length=total, label=self._label, file=sys.stderr))
        self._bar.update(count)


def _print_report(report: ReplayReport, name: str) -> None:
    if report.dry_run and report.planned:
        click.echo(formatting.table(["record", "to"], [[f"{p}:{o}", dest]
                                                        for (_, p, o), dest in report.planned]))
    for skipped in report.skipped:
        _, partition, offset = skipped.source
        click.echo(f"skipped {partition}:{offset}: {formatting.shown(skipped.why)}", err=True)
    verb = "would replay" if report.dry_run else "replayed"
    count = len(report.planned) if report.dry_run else len(report.replayed)
    click.echo(f"{verb} {count} of {report.selected} selected record(s) of {name}; "
               f"{len(report.already)} already replayed, {len(report.skipped)} skipped")


@click.command("resume")
@_connection_options
@click.option("--group", required=True, help="The consumer group whose partitions to resume.")
@click.option("--topic", default=None, help="Only this topic's partitions (main or retry topic).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Only this partition of --topic.")
@click.option("--actor", default=None, help="Who resumes, for the record (user@host).")
def resume_command(connection: dict[str, str], timeout_s: float, group: str, topic: str | None,
                   partition: int | None, actor: str | None) -> None:
    """Let partitions the dead-letter brake stopped go on.

    The request goes to the control topic; each running consumer of the group releases the
    braked partitions it covers at its next poll, with their counts started afresh, and a Spark
    pipeline of the group waiting on its stops starts its query again from its checkpoint.
    """
    request = Resume(group, topic, partition, actor or default_actor(), now_ms())
    where = request_resume(_connect(connection), request, timeout_s)
    scope = "every braked partition" if topic is None else (
        f"{topic}" if partition is None else f"{topic}[{partition}]")
    click.echo(f"resume of {scope} requested for group {group} "
               f"({CONTROL_TOPIC} offset {where.offset})")


@click.command("stats")
@_connection_options
@click.option("--topic", required=True, help="The group's main topic.")
@click.option("--group", required=True, help="The consumer group or pipeline name.")
@policy_options
@click.option("--window", default="10s", show_default=True,
              help="Sample offsets twice this far apart for the rates (0: no rates).")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
def stats_command(connection: dict[str, str], timeout_s: float, topic: str, group: str, window: str,
                  watch: bool, **policy_args: Any) -> None:
    """Records waiting, lag, oldest record and rates for a group's main, retry and DLT topics.

    The topics are planned from the group's policy if given (as in `topics plan`), else found on
    the cluster. A Spark pipeline of the group that the dead-letter brake stopped is named below
    the table, with the command that resumes it.
    """
    window_s = to_ms(window, "window") / 1000
    policy = _group_policy(**policy_args)
    if window_s > 0 and not watch and sys.stderr.isatty():
        click.echo(f"sampling offsets over {window} for the rates (--window 0 skips it)...",
                   err=True)
    while True:
        found = stats.collect(_connect(connection), topic, group, policy=policy, window_s=window_s,
                              timeout_s=timeout_s)
        table = formatting.table(STATS_COLUMNS, stats_rows(found, now_ms()))
        stopped = _stopped(_connect(connection), group, timeout_s)
        table = "\n".join([table, *stopped])
        if not watch:
            click.echo(table)
            if len(found) == 1 and found[0].lag is None:
                # A mistyped group reads like a healthy one that has not started yet.
                click.echo(f"note: group {group} has committed nothing on {topic} and has no "
                           "retry or dead-letter topics there", err=True)
            return
        click.clear()
        click.echo(f"{group} on {topic}  {time.strftime('%H:%M:%S UTC', time.gmtime())}"
                   f"  (every {window}; Ctrl-C stops)\n{table}")
        if window_s <= 0:
            time.sleep(2.0)


def _stopped(connection: kafka.Connection, group: str, timeout_s: float) -> list[str]:
    """Lines naming the group's Spark stops that stand (a consumer's stops live in the
    consumer: its log and `redrive_braked_partitions` say them)."""
    standing = control.standing_stops(connection, group, timeout_s)
    at = now_ms()
    return [f"stopped by the dead-letter brake: {stop.topic}[{stop.partition}] at offset "
            f"{stop.offset}, {formatting.since(stop.at_ms, at)} ago ({stop.limit}); the "
            f"pipeline waits for: {control.resume_command(connection, group, [stop])}"
            for stop in standing.active]


STATS_COLUMNS = ["topic", "role", "waiting", "lag", "oldest", "next due", "oldest deleted",
                 "in/s", "out/s"]


def stats_rows(found: Sequence[stats.TopicStats], at_ms: int) -> list[list[object]]:
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return [[item.topic, item.role, item.waiting, "-" if item.lag is None else item.lag,
             "-" if item.oldest_ms is None else formatting.since(item.oldest_ms, at_ms),
             "-" if item.next_due_ms is None else formatting.relative(item.next_due_ms, at_ms),
             "-" if item.oldest_deleted_ms is None
             else formatting.relative(item.oldest_deleted_ms, at_ms),
             rate(item.rate(item.appended)), rate(item.rate(item.consumed))]
            for item in found]
