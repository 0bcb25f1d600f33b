"""Checks of the arguments users pass, each failing with an InvalidArgument that names the field,
the value and what was expected."""

from __future__ import annotations

from typing import Any

from redrive.errors import InvalidArgument


def check_int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(field, value, f"must be an integer in {low}..{high}")
    return value


def check_positive(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgument(field, value, "must be a number > 0")
    return float(value)


def check_instance(field: str, value: Any, kind: type | tuple[type, ...], expected: str) -> None:
    if not isinstance(value, kind):
        raise InvalidArgument(field, value, f"must be {expected}")
