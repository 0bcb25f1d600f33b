"""`redrive store ...`: run the scheduler, and inspect or act on stored retries."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click

from redrive.cli.formatting import iso, preview, shown, since, table
from redrive.cli.options import connection_options, metrics_port_option
from redrive.clock import now_ms
from redrive.errors import RedriveError
from redrive.policy import to_ms
from redrive.store.database import DEFAULT_PATH
from redrive.store.rows import RowFilter, StoredRetry
from redrive.store.scheduler import Scheduler
from redrive.store.schema import STATUSES
from redrive.store.store import RetryStore


@click.group("store")
@click.option("--url", default=str(DEFAULT_PATH), envvar="REDRIVE_STORE_URL", show_envvar=True,
              show_default=True,
              help="The store: a SQLite file path or a database URL (postgresql://...).")
@click.pass_context
def store_command(ctx: click.Context, url: str) -> None:
    """The durable retry store: its scheduler, and what it holds."""
    ctx.obj = url


# A row id is a positive 64-bit integer in both databases (larger ones raised from the driver).
_ROW_ID = click.IntRange(1, 2**63 - 1)


def _open(ctx: click.Context, *, create: bool = False) -> RetryStore:
    try:
        return RetryStore(str(ctx.obj), create=create)
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc


def _filters(function: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("ids", nargs=-1, type=_ROW_ID),
        click.option("--group", default=None, help="Only this consumer group / pipeline."),
        click.option("--topic", default=None, help="Only records of this original topic."),
        click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES),
                     help="Only rows in this status; repeatable."),
        click.option("--error-type", default=None,
                     help="Only this error type (qualified, or its last part: TimeoutError)."),
        click.option("--older-than", default=None, metavar="AGE",
                     help="Only rows stored at least AGE ago (e.g. 30m, 2d)."),
        click.option("--newer-than", default=None, metavar="AGE",
                     help="Only rows stored at most AGE ago."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _filter(ids: tuple[int, ...], group: str | None, topic: str | None,
            statuses: tuple[str, ...], error_type: str | None, older_than: str | None,
            newer_than: str | None) -> RowFilter:
    try:
        return RowFilter(ids=ids, group=group, topic=topic, statuses=statuses,
                      error_type=error_type,
                      older_than_ms=None if older_than is None else to_ms(older_than,
                                                                          "--older-than"),
                      newer_than_ms=None if newer_than is None else to_ms(newer_than,
                                                                          "--newer-than"))
    except RedriveError as exc:
        raise click.BadParameter(str(exc)) from exc


def _narrowed(where: RowFilter, action: str) -> RowFilter:
    if not where.narrows:
        raise click.UsageError(f"{action} acts on every row unless told which: name ids or give "
                               "at least one of --group, --topic, --status, --error-type, "
                               "--older-than, --newer-than")
    return where


@store_command.command("run")
@connection_options
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="Due rows taken per pass.")
@click.option("--idle", "idle_s", type=float, default=0.05, show_default=True,
              help="Seconds to wait between passes when nothing more is due.")
@click.option("--webhook", default=None, help="POST each record that dies to this URL (JSON).")
@click.option("--lease", "lease", default="10m", show_default=True,
              help="How long a republished retry may stay unreported before it is republished "
                   "again (e.g. 90s, 10m).")
@metrics_port_option
@click.pass_context
def run_command(ctx: click.Context, connection: dict[str, str], batch_size: int, idle_s: float,
                webhook: str | None, lease: str, metrics_port: int | None) -> None:
    """Republish due retries until SIGTERM or Ctrl-C (run several to share the work on
    PostgreSQL)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        lease_ms = to_ms(lease, "--lease")
    except RedriveError as exc:
        raise click.BadParameter(str(exc), param_hint="--lease") from exc
    if lease_ms <= 0:
        raise click.BadParameter(f"{lease!r} is not a positive duration", param_hint="--lease")
    store = _open(ctx, create=True)
    try:
        scheduler = Scheduler(store, connection, batch_size=batch_size, idle_s=idle_s,
                              webhook=webhook, lease_s=lease_ms / 1000)
        if metrics_port is not None:
            scheduler.metrics.serve(metrics_port)
        scheduler.run()
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
    click.echo(f"stopped after publishing "
               f"{scheduler.metrics.total('redrive_forwarded_total'):.0f} record(s)")


@store_command.command("ls")
@_filters
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_context
def ls_command(ctx: click.Context, /, limit: int, **filters: Any) -> None:
    """List stored retries (oldest first), with a count per status."""
    where = _filter(**filters)
    store = _open(ctx)
    try:
        rows = store.find(where, limit=limit)
        counts = store.counts(where)
    finally:
        store.close()
    now = now_ms()
    click.echo(table(
        ["id", "group", "topic", "partition", "offset", "key", "attempt", "status", "due in",
         "error", "age"],
        [[r.id, r.group, r.topic, r.partition, r.offset, preview(r.key), r.attempt, r.status,
          _due_in(r, now), r.reason or r.error_type or "", since(r.created_ms, now)]
         for r in rows]))
    summary = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))
    click.echo(f"\n{sum(counts.values())} row(s){': ' + summary if summary else ''}"
               + (f" (showing {len(rows)})" if len(rows) < sum(counts.values()) else ""))


def _due_in(row: StoredRetry, now: int) -> str:
    if row.status != "pending":
        return ""
    return "now" if row.due_ms <= now else since(now, row.due_ms)


@store_command.command("show")
@click.argument("retry_id", type=_ROW_ID)
@click.pass_context
def show_command(ctx: click.Context, retry_id: int) -> None:
    """Everything stored about one retry: its record, history and last error."""
    store = _open(ctx)
    try:
        row = store.get(retry_id)
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
    fields: list[list[object]] = [
        ["id", row.id], ["group", row.group],
        ["original", f"{row.topic}[{row.partition}]@{row.offset}"],
        ["timestamp", iso(row.timestamp_ms)], ["key", preview(row.key)], ["mode", row.mode],
        ["republish to", row.destination], ["status", row.status], ["reason", row.reason],
        ["attempt", row.attempt], ["first failure", iso(row.first_failure_ms)],
        ["due", iso(row.due_ms)], ["dispatches", row.dispatches],
        ["last dispatch", iso(row.dispatched_ms)], ["stored", iso(row.created_ms)],
        ["updated", iso(row.updated_ms)], ["error type", row.error_type],
        ["error message", row.error_message],
    ]
    click.echo(table(["field", "value"], fields))
    if row.value is not None:
        click.echo(f"\nvalue ({len(row.value)} bytes): {shown(preview(row.value))}")
    if row.headers:
        click.echo("\n" + table(["header", "value"],
                                 [[name, "(null)" if value is None else preview(value)]
                                  for name, value in row.headers
                                  if not name.startswith("redrive-")]))
    if row.error_trace:
        click.echo("\n" + "\n".join(shown(line) for line in row.error_trace.rstrip().split("\n")))


@store_command.command("requeue")
@_filters
@click.option("--in", "delay", default=None, metavar="DELAY",
              help="Due after DELAY (e.g. 5m) instead of now.")
@click.option("--reset-attempts", is_flag=True,
              help="Start the attempt count again, so the policy allows every retry anew.")
@click.pass_context
def requeue_command(ctx: click.Context, /, delay: str | None, reset_attempts: bool,
                    **filters: Any) -> None:
    """Make matching rows pending again, due now (or --in DELAY): dead, cancelled and in-flight
    rows, and pending ones waiting out their backoff (--status dead: only the dead)."""
    where = _narrowed(_filter(**filters), "requeue")
    try:
        due = None if delay is None else now_ms() + to_ms(delay, "--in")
    except RedriveError as exc:
        raise click.BadParameter(str(exc), param_hint="--in") from exc
    store = _open(ctx)
    try:
        count = store.requeue(where, due_ms=due, reset_attempts=reset_attempts)
    finally:
        store.close()
    click.echo(f"requeued {count} row(s)")


@store_command.command("cancel")
@_filters
@click.pass_context
def cancel_command(ctx: click.Context, /, **filters: Any) -> None:
    """Cancel pending, in-flight or parked rows: they are not republished."""
    where = _narrowed(_filter(**filters), "cancel")
    store = _open(ctx)
    try:
        count = store.cancel(where)
    finally:
        store.close()
    click.echo(f"cancelled {count} row(s)")


@store_command.command("purge")
@_filters
@click.pass_context
def purge_command(ctx: click.Context, /, **filters: Any) -> None:
    """Delete finished rows (succeeded, dead, cancelled) matching the filters."""
    where = _narrowed(_filter(**filters), "purge")
    store = _open(ctx)
    try:
        count = store.purge(where)
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
    click.echo(f"purged {count} row(s)")
