"""The Spark pipeline's per-record function and policy for the chaos driver (shipped to the
executors by value, so they need not import it)."""

from __future__ import annotations

from typing import Any

from chaoslib import workload
from redrive.policy import Backoff, RetryPolicy

POLICY = RetryPolicy(backoff=Backoff.fixed("1s"), attempts=workload.ATTEMPTS)
OUTPUT_SCHEMA = "number long, attempt int"


def handle(record: dict[str, Any]) -> dict[str, Any]:
    number = int(record["value"])
    if workload.fails(number, record["attempt"]):
        raise workload.Flaky(f"{number} fails")
    return {"number": number, "attempt": record["attempt"]}
