"""`redrive ui`: the operations console, a web page over the dead letters and their replay."""

from __future__ import annotations

from pathlib import Path

import click

from redrive.cli.options import connection_options
from redrive.delay.service import DEFAULT_GROUP
from redrive.delay.tiers import DEFAULT_PREFIX
from redrive.errors import RedriveError


@click.command("ui")
@connection_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: only this machine unless told otherwise.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host name the console also answers to (repeatable; *.example.com for a "
                   "domain's), besides 127.0.0.1, localhost, ::1 and --host: a request naming "
                   "any other is refused, so that a page of another site cannot reach the "
                   "console through a name of its own.")
@click.option("--token", envvar="REDRIVE_UI_TOKEN", show_envvar=True, default=None,
              help="Replays need this token; without one the console is read-only "
                   "[env: REDRIVE_UI_TOKEN]. On the command line it shows in `ps`: prefer "
                   "the variable or --token-file.")
@click.option("--token-file", envvar="REDRIVE_UI_TOKEN_FILE", show_envvar=True, default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Read the token from this file (surrounding whitespace left out) "
                   "[env: REDRIVE_UI_TOKEN_FILE].")
@click.option("--store-url", envvar="REDRIVE_STORE_URL", show_envvar=True, default=None,
              help="Also show the retry store (a SQLite path or a database URL) "
                   "[env: REDRIVE_STORE_URL].")
@click.option("--delay-prefix", default=DEFAULT_PREFIX, show_default=True,
              help="The delay service's tier topics, whose waiting retries the overview shows.")
@click.option("--delay-group", default=DEFAULT_GROUP, show_default=True,
              help="The delay service's consumer group.")
def ui_command(connection: dict[str, str], host: str, port: int, allowed_hosts: tuple[str, ...],
               token: str | None, token_file: Path | None, store_url: str | None,
               delay_prefix: str, delay_group: str) -> None:
    """Serve the operations console (dead letters, their causes, replay) until Ctrl-C."""
    if token_file is not None:
        if token is not None:
            raise click.UsageError("give the token once: --token (or REDRIVE_UI_TOKEN) or "
                                   "--token-file")
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            # Read when the console starts, not when the line is parsed: a README line names
            # a file the reader has not made yet.
            raise click.BadParameter(f"{token_file} cannot be read: {exc}",
                                     param_hint="--token-file") from exc
        if not token:
            # An empty file would start a read-only console that seemed to have a token.
            raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
    try:
        import uvicorn

        from redrive.ops.waiting import DelayTiers
        from redrive.ops.web import LOCAL_HOSTS, create_app
    except ImportError as exc:
        raise click.ClickException(f"the console needs redrive's `ui` extra "
                                   f"(pip install 'redrive[ui]'): {exc}") from exc
    from redrive.store import RetryStore

    try:
        store = RetryStore(store_url, create=False) if store_url else None
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"redrive console on http://{host}:{port}/ "
               f"({'replay enabled' if token else 'read-only: no --token'})")
    try:
        hosts = list(dict.fromkeys([*LOCAL_HOSTS, host, *allowed_hosts]))
        uvicorn.run(create_app(connection, token=token, store=store,
                               delay=DelayTiers(delay_prefix, delay_group), hosts=hosts),
                    host=host, port=port, log_level="warning")
    finally:
        if store is not None:
            store.close()
