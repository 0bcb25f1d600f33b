"""Options and option types the commands share: the broker, librdkafka settings, a retry policy.

The retry and dead-letter topic names derive from the policy (see `redrive.topics.plan`), so
`topics plan|create`, `dlt replay` and `stats` must read a policy from the same options to agree
on the names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from click.core import ParameterSource

from redrive.policy import Backoff, Naming, RetryPolicy

Decorated = TypeVar("Decorated", bound=Callable[..., Any])


def with_options(options: Sequence[Callable[[Decorated], Decorated]]) -> Callable[
        [Decorated], Decorated]:
    """One decorator applying `options` in the order listed (as they show in --help)."""
    def apply(function: Decorated) -> Decorated:
        for option in reversed(options):
            function = option(function)
        return function
    return apply


metrics_port_option = click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                                   help="Serve Prometheus metrics on this port.")


_NAME = re.compile(r"[\w.-]*")


class Setting(click.ParamType):  # type: ignore[type-arg]
    """A librdkafka setting written KEY=VALUE."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        name, sep, setting = str(value).partition("=")
        if not sep or not name.strip():
            # Only the name is shown: `sasl.password hunter2` is a secret with its = missing.
            shown = _NAME.match(str(value))
            named = shown.group() if shown else ""
            rest = " (what follows it is not shown: it may be a secret)" \
                if len(named) < len(str(value)) else ""
            self.fail(f"{named!r}: expected KEY=VALUE{rest}", param, ctx)
        return name.strip(), setting


SETTING = Setting()

_CONNECTION_OPTIONS = (
    click.option("--bootstrap", "-b", default=None, envvar="REDRIVE_BOOTSTRAP", show_envvar=True,
                 help="Kafka bootstrap servers (host:port); or bootstrap.servers in "
                      "--config-file or --config, which REDRIVE_BOOTSTRAP does not override."),
    click.option("--config-file", "config_file", default=None, envvar="REDRIVE_KAFKA_CONFIG",
                 show_envvar=True, type=click.Path(dir_okay=False, path_type=Path),
                 help="librdkafka settings, one KEY=VALUE a line (# comments): a secured "
                      "cluster's security.protocol, sasl.*, ssl.* (secrets kept out of `ps`)."),
    click.option("--config", "-X", "client_settings", type=SETTING, multiple=True,
                 help="A librdkafka setting for every client (repeatable), over "
                      "--config-file's."),
)


def connection_options(function: Decorated) -> Decorated:
    """--bootstrap, --config-file and --config, handed to the command as one `connection`: the
    librdkafka settings every client it makes shares, bootstrap.servers among them."""
    @functools.wraps(function)
    def command(*args: Any, bootstrap: str | None, config_file: Path | None,
                client_settings: Sequence[tuple[str, str]], **kwargs: Any) -> Any:
        connection = read_config_file(config_file) if config_file is not None else {}
        connection.update(settings(client_settings))
        # A variable left exported (a development cluster's) must not send a command whose
        # settings name their brokers, credentials included, to another cluster.
        given = click.get_current_context().get_parameter_source("bootstrap")
        if bootstrap and (given is not ParameterSource.ENVIRONMENT
                          or not connection.get("bootstrap.servers")):
            connection["bootstrap.servers"] = bootstrap
        if not connection.get("bootstrap.servers"):
            raise click.UsageError("which brokers? give --bootstrap (or REDRIVE_BOOTSTRAP), or "
                                   "bootstrap.servers in --config-file or --config")
        return function(*args, connection=connection, **kwargs)
    return with_options(_CONNECTION_OPTIONS)(cast(Decorated, command))


def read_config_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and lines starting with # or ! left out), as Kafka's
    client.properties files hold them, with librdkafka's names."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path} cannot be read: {exc}",
                                 param_hint="--config-file") from exc
    found: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            # The line itself is not shown: it may hold a secret.
            raise click.BadParameter(f"{path} line {number} is not KEY=VALUE",
                                     param_hint="--config-file")
        found[name.strip()] = value.strip()
    return found


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A wait in seconds: above 0, finite, at most `most` (librdkafka's waits are ms in 32
    bits, and click's FloatRange takes nan)."""

    name = "SECONDS"

    def __init__(self, most: float) -> None:
        self.most = most

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not 0 < seconds <= self.most:  # nan fails it too
            self.fail(f"{value!r}: expected seconds above 0, at most {self.most:g}", param, ctx)
        return seconds


def settings(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Repeated KEY=VALUE options as a config mapping; a later KEY wins."""
    return dict(pairs)


_POLICY_OPTIONS = (
    click.option("--backoff", default=None,
                 help='Fixed delay ("5s") or a sequence ("5m,5m,30m,30m,30m,1h").'),
    click.option("--exponential", default=None, metavar="INITIAL",
                 help="Exponential backoff starting at INITIAL (e.g. 1s)."),
    click.option("--multiplier", default=None, type=float,
                 help="Growth of exponential delays, with --exponential.  [default: 2]"),
    click.option("--max-delay", default=None, help="Cap for exponential delays, with "
                 "--exponential."),
    click.option("--attempts", type=int, default=None,
                 help="Deliveries in all, the first included (a sequence implies it)."),
    click.option("--naming", type=click.Choice([n.value for n in Naming]),
                 default=Naming.PER_DELAY.value, show_default=True),
    click.option("--no-dlt", is_flag=True, help="Plan no dead-letter topic."),
)


def policy_options(function: Decorated) -> Decorated:
    """Add the policy options; the command gets them as the arguments of `policy_from_options`."""
    return with_options(_POLICY_OPTIONS)(function)


def policy_from_options(*, backoff: str | None, exponential: str | None,
                        multiplier: float | None,
                        max_delay: str | None, attempts: int | None, naming: str,
                        no_dlt: bool) -> RetryPolicy:
    """The policy the options describe: fixed 1s delays unless --backoff or --exponential.

    An invalid value raises InvalidPolicy, naming the field and the value.
    """
    if backoff is not None and exponential is not None:
        raise click.UsageError("give either --backoff or --exponential, not both")
    # Without --exponential they would shape nothing, and the delays would not be those asked.
    for option, value in (("--max-delay", max_delay), ("--multiplier", multiplier)):
        if value is not None and exponential is None:
            raise click.UsageError(f"{option} needs --exponential: it shapes exponential "
                                   "delays only")
    if exponential is not None:
        schedule: Backoff = Backoff.exponential(
            exponential, 2.0 if multiplier is None else multiplier, max_delay)
    else:
        schedule = Backoff.parse(backoff or "1s")
    return RetryPolicy(backoff=schedule, attempts=attempts, naming=naming,
                       dead_letter=not no_dlt)
