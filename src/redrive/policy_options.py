"""The command-line options that describe a retry policy, shared by every command that takes one.

The retry and dead-letter topic names derive from the policy (see `redrive.topics.plan`), so
`topics plan|create`, `dlt replay` and `stats` must read a policy from the same options to agree
on the names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from redrive.policy import Backoff, Naming, RetryPolicy

Decorated = TypeVar("Decorated", bound=Callable[..., Any])

_OPTIONS = (
    click.option("--backoff", default=None,
                 help='Fixed delay ("5s") or a sequence ("5m,5m,30m,30m,30m,1h").'),
    click.option("--exponential", default=None, metavar="INITIAL",
                 help="Exponential backoff starting at INITIAL (e.g. 1s)."),
    click.option("--multiplier", default=2.0, show_default=True, type=float),
    click.option("--max-delay", default=None, help="Cap for exponential delays."),
    click.option("--attempts", type=int, default=None,
                 help="Deliveries in all, the first included (a sequence implies it)."),
    click.option("--naming", type=click.Choice([n.value for n in Naming]),
                 default=Naming.PER_DELAY.value, show_default=True),
    click.option("--no-dlt", is_flag=True, help="Plan no dead-letter topic."),
)


def policy_options(function: Decorated) -> Decorated:
    """Add the policy options; the command gets them as the arguments of `policy_from_options`."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def policy_from_options(*, backoff: str | None, exponential: str | None, multiplier: float,
                        max_delay: str | None, attempts: int | None, naming: str,
                        no_dlt: bool) -> RetryPolicy:
    """The policy the options describe: fixed 1s delays unless --backoff or --exponential.

    An invalid value raises InvalidPolicy, naming the field and the value.
    """
    if backoff is not None and exponential is not None:
        raise click.UsageError("give either --backoff or --exponential, not both")
    if exponential is not None:
        schedule: Backoff = Backoff.exponential(exponential, multiplier, max_delay)
    else:
        schedule = Backoff.parse(backoff or "1s")
    return RetryPolicy(backoff=schedule, attempts=attempts, naming=naming,
                       dead_letter=not no_dlt)
