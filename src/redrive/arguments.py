"""Checks of the arguments users pass, each failing with an InvalidArgument that names the field,
the value and what was expected."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from redrive.errors import InvalidArgument


def check_int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(field, value, f"must be an integer in {low}..{high}")
    return value


def check_positive(field: str, value: Any) -> float:
    # Infinity too is refused: librdkafka takes its timeouts as whole milliseconds.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise InvalidArgument(field, value, "must be a finite number > 0")
    return float(value)


def check_seconds(field: str, value: Any) -> float:
    """A wait that may be 0 (at once), never negative or endless."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidArgument(field, value, "must be a finite number of seconds >= 0")
    return float(value)


def check_instance(field: str, value: Any, kind: type | tuple[type, ...], expected: str) -> None:
    if not isinstance(value, kind):
        raise InvalidArgument(field, value, f"must be {expected}")


def check_optional(field: str, value: Any, kind: type | tuple[type, ...], expected: str) -> None:
    """check_instance where None, the default, is allowed too."""
    if value is not None:
        check_instance(field, value, kind, f"{expected} (or None)")


def check_text(field: str, value: Any) -> None:
    """An optional name: None, or a string that is not empty (an empty one is not a default)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidArgument(field, value, "must be a non-empty string (or None)")


def check_settings(field: str, value: Any) -> dict[str, Any]:
    """Client settings (librdkafka's names and values) as a new dict; None gives none."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(field, value, "must be a mapping of client settings, such as "
                              "{'fetch.min.bytes': 1} (or None)")
    return dict(value)


def check_function(field: str, value: Any, takes: str) -> None:
    """A function redrive calls and does not await: an async one would return a coroutine that
    nothing runs, and its records would count as handled."""
    if not callable(value):
        raise InvalidArgument(field, value, f"must be callable with {takes}")
    if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value) \
            or inspect.iscoroutinefunction(type(value).__call__):
        raise InvalidArgument(field, value, "is an async function, which redrive would call "
                              "without awaiting: give a plain function (one that runs the "
                              "coroutine with asyncio.run, for example)")
