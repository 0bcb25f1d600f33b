"""What more than one bench script measures with: percentiles."""

from __future__ import annotations

import math


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `fraction` of the values at
    or below it (p99 of 1..100 is 99). 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    # fraction * n in floating point can land just above a whole number (0.07 * 100 is
    # 7.000000000000001), which ceil would take one rank too high.
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[min(len(ordered), max(1, rank)) - 1]
