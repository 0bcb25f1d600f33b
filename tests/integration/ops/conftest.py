"""Helpers for the operations tests: the CLI with the ops commands, a consumer in a thread."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from click.testing import CliRunner, Result

from redrive import kafka
from redrive.cli import _Group
from redrive.cli.ops import dlt, stats_command

from ..records import produce_input

ROOT = _Group("redrive", commands={"dlt": dlt, "stats": stats_command})


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(ROOT, list(args), catch_exceptions=False)


def run_json(*args: str) -> Any:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def produce_records(bootstrap: str, topic: str,
                    records: Sequence[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
                    partition: int | None = None) -> None:
    """(key, value, headers) triples, acknowledged before returning."""
    produce_input(bootstrap, [
        kafka.OutRecord(topic, value, key, headers, partition) for key, value, headers in records])


def topic_sizes(bootstrap: str, *names: str) -> dict[str, int]:
    """Records written to each topic so far (end offsets summed; 0 for a missing topic)."""
    counts = kafka.topic_partitions(kafka.admin(bootstrap))
    consumer = kafka.consumer(bootstrap)
    try:
        return {name: sum(kafka.watermarks(consumer, name, p)[1]
                          for p in range(counts.get(name, 0))) for name in names}
    finally:
        consumer.close()




