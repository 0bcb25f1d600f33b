"""Durations as users write them: `250ms`, `5s`, `5m`, `1h`, `1d`, or a number of seconds."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from redrive.errors import InvalidArgument

Duration = str | int | float | timedelta

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def to_ms(value: Duration, field: str = "duration",
          error: type[InvalidArgument] = InvalidArgument) -> int:
    """Milliseconds in a duration; raises `error` naming `field` and the value (a policy's own
    durations raise InvalidPolicy)."""
    if isinstance(value, bool):
        raise error(field, value, "expected a duration such as 250ms, 5s, 5m, 1h, 1d")
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, int | float):
        if not math.isfinite(value):
            raise error(field, value, "must be a finite number of seconds")
        ms = value * 1000
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise error(field, value,
                                "expected a duration such as 250ms, 5s, 5m, 1h, 1d or seconds")
        ms = float(match.group(1)) * _UNITS_MS[match.group(2) or "s"]
    else:
        raise error(field, value, "expected a duration such as 250ms, 5s, 5m, 1h, 1d")
    if ms < 0:
        raise error(field, value, "must not be negative")
    if ms == math.inf:  # finite, and past what a float holds once in ms
        raise error(field, value, "too large")
    return round(ms)


def format_ms(ms: int) -> str:
    """The shortest exact spelling, used in topic names: 300000 -> `5m`, 1500 -> `1500ms`."""
    if ms < 0:
        raise InvalidArgument("duration", ms, "must not be negative")
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
