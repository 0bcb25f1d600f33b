"""`redrive ui`: the operations console, a web page over the dead letters and their replay."""

from __future__ import annotations

import click

from redrive.cli.options import bootstrap_option
from redrive.delay.service import DEFAULT_GROUP
from redrive.delay.tiers import DEFAULT_PREFIX
from redrive.errors import RedriveError


@click.command("ui")
@bootstrap_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: only this machine unless told otherwise.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--token", envvar="REDRIVE_UI_TOKEN", show_envvar=True, default=None,
              help="Replays need this token; without one the console is read-only "
                   "[env: REDRIVE_UI_TOKEN].")
@click.option("--store-url", envvar="REDRIVE_STORE_URL", show_envvar=True, default=None,
              help="Also show the retry store (a SQLite path or a database URL) "
                   "[env: REDRIVE_STORE_URL].")
@click.option("--delay-prefix", default=DEFAULT_PREFIX, show_default=True,
              help="The delay service's tier topics, whose waiting retries the overview shows.")
@click.option("--delay-group", default=DEFAULT_GROUP, show_default=True,
              help="The delay service's consumer group.")
def ui_command(bootstrap: str, host: str, port: int, token: str | None,
               store_url: str | None, delay_prefix: str, delay_group: str) -> None:
    """Serve the operations console (dead letters, their causes, replay) until Ctrl-C."""
    try:
        import uvicorn

        from redrive.ops.waiting import DelayTiers
        from redrive.ops.web import create_app
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
        uvicorn.run(create_app(bootstrap, token=token, store=store,
                               delay=DelayTiers(delay_prefix, delay_group)),
                    host=host, port=port, log_level="warning")
    finally:
        if store is not None:
            store.close()
