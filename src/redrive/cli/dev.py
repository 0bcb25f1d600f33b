"""`redrive dev-broker`: a development broker in the foreground, for trying redrive."""

from __future__ import annotations

import click


@click.command("dev-broker")
@click.option("--kind", type=click.Choice(["noida-db", "tansu"]), default="noida-db",
              show_default=True)
@click.option("--port", type=int, default=9092, show_default=True)
@click.option("--data-dir", default=None,
              help="Where noida-db keeps its data [default: .redrive/dev-broker/KIND]; Tansu "
                   "keeps everything in memory.")
def dev_broker(kind: str, port: int, data_dir: str | None) -> None:
    """Run a development broker in the foreground (for trying redrive; not for production)."""
    from redrive.dev import brokers

    try:
        brokers.serve(kind, port, data_dir)
    except (brokers.DevBrokerError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
