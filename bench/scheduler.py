"""Benchmark of the store scheduler alone: what one pass costs beyond producing its copies.

    python bench/scheduler.py [--quick] [--rows N] [--runs N] [--bootstrap HOST:PORT]
                              [--postgres URL] [--json]

Starts its own noida-db unless --bootstrap is given, and its own PostgreSQL server (durable, as
bench/store.py) unless --postgres is given. Each round writes N due payload rows (100-byte values,
one header of the record's own, an error trace) into a new SQLite store and a new PostgreSQL
database, and times `Scheduler.run_once` on each until nothing is left: rows/s, and CPU a row
(this process's CPU time, librdkafka's threads included). The baseline, in the same round: the
same copies with the same headers, built beforehand, produced with delivery confirmation in the
scheduler's batch size: the part of a pass no store can save. Each path runs on a topic of its
own, deleted after it, once the broker is idle, in an order rotated from round to round.

C1  scheduler rows/s on SQLite / baseline records/s.
C2  the same on PostgreSQL.
The CPU columns say where the difference goes: a pass's CPU a row minus the baseline's is the
store's share (claim, decode, build, settle).
With --json the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from common import CpuMeter, settle
from redrive import kafka
from redrive.cli.formatting import table
from redrive.clock import now_ms
from redrive.dev.brokers import DevBroker
from redrive.dev.postgres import DevPostgres
from redrive.store import RetryStore
from redrive.store.rows import Entry
from redrive.store.scheduler import DEFAULT_BATCH, Scheduler
from redrive.store.schema import PENDING

VALUE_BYTES = 100
TRACE = "Traceback (most recent call last):\n" + "  File \"app.py\", line 1, in handle\n" * 8


@dataclass(frozen=True)
class Timing:
    rate: float  # rows or records a second
    cpu_us: float  # this process's CPU time a row or record


def timed(count: int, work: Callable[[], int]) -> Timing:
    # The rows and copies this process built stay out of the collector's passes while it is
    # timed: a scheduler's process holds none of them.
    gc.collect()
    gc.freeze()
    cpu, wall = time.process_time(), time.perf_counter()
    done = work()
    if done != count:
        raise SystemExit(f"expected {count} rows published, got {done}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gc.unfreeze()
    return Timing(count / wall, cpu / count * 1e6)


def entries(topic: str, rows: int) -> list[Entry]:
    at = now_ms()
    return [Entry(group="bench", topic=topic, partition=0, offset=offset, timestamp_ms=at,
                  key=b"k%d" % offset, mode="payload", value=b"%08d" % offset
                  + b"x" * VALUE_BYTES, headers=[("trace-id", b"t-%d" % offset)], target=None,
                  attempt=1, first_failure_ms=at, due_ms=at - 1000, status=PENDING,
                  reason=None, error_type="app.Down", error_message="down",
                  error_trace=TRACE) for offset in range(rows)]


def new_topic(admin: Any) -> str:
    topic = f"bench-scheduler-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(admin, {topic: 1})
    while kafka.topic_partitions(admin).get(topic) != 1:
        time.sleep(0.05)
    return topic


def copies_for(bootstrap: str, url: str, topic: str, rows: int) -> list[kafka.OutRecord]:
    """The copies a pass would make of `rows` rows, built by the scheduler's own code."""
    store = RetryStore(url)
    try:
        written = entries(topic, rows)
        for start in range(0, len(written), 1000):
            store.write(written[start:start + 1000], [])
        scheduler = Scheduler(store, bootstrap)
        try:
            return [copy for row in store.find(limit=rows)
                    if (copy := scheduler._record(row)) is not None]
        finally:
            scheduler.close()
    finally:
        store.close()


def baseline(bootstrap: str, copies: list[kafka.OutRecord], meter: CpuMeter) -> Timing:
    """The copies a pass would produce, built beforehand, produced in the scheduler's batches."""
    producer = kafka.producer(bootstrap)
    kafka.produce_confirmed(producer, copies[:1])  # connected before the clock starts
    measured = copies[1:]

    def produce_all() -> int:
        for start in range(0, len(measured), DEFAULT_BATCH):
            kafka.produce_confirmed(producer, measured[start:start + DEFAULT_BATCH], 60)
        return len(measured)
    settle(meter)
    return timed(len(measured), produce_all)


def scheduler_run(bootstrap: str, url: str, topic: str, rows: int, meter: CpuMeter) -> Timing:
    """Time the passes over `rows` due rows, after a first pass over DEFAULT_BATCH more that
    connects the clients."""
    store = RetryStore(url)
    try:
        written = entries(topic, rows + DEFAULT_BATCH)
        for start in range(0, len(written), 1000):
            store.write(written[start:start + 1000], [])
        scheduler = Scheduler(store, bootstrap)
        try:
            if scheduler.run_once().published != DEFAULT_BATCH:
                raise SystemExit("the first pass did not publish a whole batch")

            def passes() -> int:
                published = 0
                while done := scheduler.run_once().published:
                    published += done
                return published
            settle(meter)
            return timed(rows, passes)
        finally:
            scheduler.close()
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: start noida-db)")
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: start a server)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds (default 3, 1 with --quick)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = args.rows or (5_000 if args.quick else 20_000)
    runs = args.runs or (1 if args.quick else 3)

    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60)
    postgres = None if args.postgres else DevPostgres(durable=True).start()
    bootstrap = args.bootstrap or (broker.bootstrap if broker else "")
    admin = kafka.admin(bootstrap)
    meter = CpuMeter(broker.pid if broker else None)
    paths = ("produce only (baseline)", "scheduler: SQLite", "scheduler: PostgreSQL")
    rounds: list[dict[str, Timing]] = []
    try:
        with TemporaryDirectory(prefix="redrive-bench-scheduler-") as scratch:
            for number in range(runs):
                pg_url = args.postgres or (postgres.create_database() if postgres else "")

                # Each path on a topic of its own, deleted after it, and the order rotated from
                # round to round: on noida-db every write costs in proportion to all the broker
                # holds, so a path run later against the others' copies would be slowed.
                first = number % len(paths)
                timings: dict[str, Timing] = {}
                for path in paths[first:] + paths[:first]:
                    topic = new_topic(admin)
                    if path == paths[0]:
                        copies = copies_for(bootstrap, str(Path(scratch) / f"{number}-copies.db"),
                                            topic, rows + 1)
                        timings[path] = baseline(bootstrap, copies, meter)
                    else:
                        url = str(Path(scratch) / f"{number}.db") if path == paths[1] else pg_url
                        timings[path] = scheduler_run(bootstrap, url, topic, rows, meter)
                    kafka.delete_topics(admin, [topic])
                rounds.append(timings)
    finally:
        if postgres is not None:
            postgres.stop()
        if broker is not None:
            broker.close()

    def median(path: str, of: Callable[[Timing], float]) -> float:
        return statistics.median(of(r[path]) for r in rounds)

    def ratio(path: str) -> float:
        return statistics.median(r[path].rate / r[paths[0]].rate for r in rounds)

    print(table(["path", "rows", "rows/s (median)", "ratio to produce only",
                 "CPU us a row (median)", "CPU us a row per round"],
                [[path, rows, f"{median(path, lambda t: t.rate):,.0f}", f"{ratio(path):.2f}",
                  f"{median(path, lambda t: t.cpu_us):.0f}",
                  " ".join(f"{r[path].cpu_us:.0f}" for r in rounds)] for path in paths]))
    figures = {
        "rows": rows, "rounds": len(rounds),
        "baseline_rate": round(median(paths[0], lambda t: t.rate), 1),
        "sqlite_rate": round(median(paths[1], lambda t: t.rate), 1),
        "postgres_rate": round(median(paths[2], lambda t: t.rate), 1),
        "sqlite_ratio": round(ratio(paths[1]), 3),
        "postgres_ratio": round(ratio(paths[2]), 3),
        "baseline_cpu_us": round(median(paths[0], lambda t: t.cpu_us), 1),
        "sqlite_cpu_us": round(median(paths[1], lambda t: t.cpu_us), 1),
        "postgres_cpu_us": round(median(paths[2], lambda t: t.cpu_us), 1),
    }
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
