"""Benchmark of the store retry path against the retry-topic path, on SQLite and PostgreSQL.

    python bench/store.py [--quick] [--runs N] [--bootstrap HOST:PORT] [--postgres URL] [--json]

Starts its own noida-db unless --bootstrap is given, and its own PostgreSQL server (durable:
fsync on, as SQLite's synchronous=FULL) unless --postgres is given. The workload is the same for
every path: N records that each fail their first delivery and succeed when retried after a 100 ms
backoff. Throughput is N over the time from the first handler call to the last retried success.
The store's scheduler runs as it is deployed: `redrive store run`, a process of its own.

Each figure is the median of --runs rounds (3 by default), a round measuring the three paths back
to back, in an order rotated from round to round, and each ratio is taken within its round. Every
run has a topic of its own, starts once the broker is idle, and deletes its topics after it.

S1  records/s through the store path (fail -> store -> due -> scheduler republishes -> succeed),
    SQLite / the retry-topic path (fail -> retry topic -> due -> succeed).
S2  the same on PostgreSQL / the retry-topic path.
S3  scheduler lateness: publish time - due time of every stored retry, p50 and p99; `early`
    counts handler calls before a record's due time and `lost` the records that never
    succeeded (both must be 0).
With --json the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

from common import CpuMeter, settle
from redrive import kafka
from redrive.backends import RetryBackend, RetryTopics
from redrive.cli.formatting import table
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.dev.brokers import DevBroker
from redrive.dev.postgres import DevPostgres
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, StoreBackend
from redrive.store.rows import Entry, RowFilter
from redrive.store.schema import IN_FLIGHT, PENDING

PARTITIONS = 4
VALUE_BYTES = 100
BACKOFF = "100ms"
GROUP_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}



def fill(bootstrap: str, records: int) -> str:
    topic = f"bench-store-{uuid.uuid4().hex[:8]}"
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {topic: PARTITIONS})
    while kafka.topic_partitions(admin).get(topic) != PARTITIONS:
        time.sleep(0.05)
    producer = kafka.producer(bootstrap)
    for index in range(records):
        kafka.produce(producer, kafka.OutRecord(topic, b"%08d" % index + b"x" * VALUE_BYTES,
                                                b"k%d" % index))
    producer.flush(60)
    return topic


@dataclass
class Run:
    records: int
    first_ms: int | None = None
    last_ms: int = 0
    succeeded: set[bytes] = field(default_factory=set)
    early: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, record: Record) -> None:
        at = now_ms()
        with self.lock:
            if self.first_ms is None:
                self.first_ms = at
            due = record.delivery.due_ms
            if due is not None and at < due:
                self.early += 1
            if record.delivery.attempt == 0:
                raise RuntimeError("first delivery fails")
            self.succeeded.add(record.value or b"")
            self.last_ms = at

    def done(self) -> bool:
        with self.lock:
            return len(self.succeeded) >= self.records

    @property
    def rate(self) -> float:
        return self.records / max(0.001, (self.last_ms - (self.first_ms or 0)) / 1000)


def measure(bootstrap: str, records: int, backend: RetryBackend, timeout_s: float,
            meter: CpuMeter) -> Run:
    """One path's run on a topic of its own, started once the broker is idle, its topics deleted
    after it: noida-db rewrites all it holds after every write, so whatever a run left or set off
    would slow the paths after it."""
    topic = fill(bootstrap, records)
    run = Run(records)
    consumer = RetryingConsumer(bootstrap, topic, f"bench-{uuid.uuid4().hex[:8]}",
                                RetryPolicy(backoff=Backoff.fixed(BACKOFF)), run.handle,
                                config=GROUP_CONFIG, retry_backend=backend)
    settle(meter)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not run.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer.stop()
    thread.join(60)
    admin = kafka.admin(bootstrap)
    existing = kafka.topic_partitions(admin)
    kafka.delete_topics(admin, [name for name in (topic, *(
        name for plan in consumer.plans.values() for name in plan.created_topics))
        if name in existing])
    return run


def start_scheduler(bootstrap: str, url: str,
                    store: RetryStore) -> tuple[subprocess.Popen[bytes], str]:
    """`redrive store run` on the store, returned once it has republished a first row (so its
    connections are made before the measured run), with the topic of that row."""
    warm_up = fill(bootstrap, 0)
    at = now_ms()
    store.write([Entry(group="bench-warm-up", topic=warm_up, partition=0, offset=0,
                       timestamp_ms=at, key=None, mode="payload", value=b"", headers=[],
                       target=None, attempt=1, first_failure_ms=at, due_ms=at, status=PENDING,
                       reason=None, error_type=None, error_message=None, error_trace=None)], [])
    process = subprocess.Popen([sys.executable, "-m", "redrive", "store", "run", "--bootstrap",
                                bootstrap], env={**os.environ, "REDRIVE_STORE_URL": url},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while store.counts(RowFilter(group="bench-warm-up")) != {IN_FLIGHT: 1}:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit("the store scheduler did not start: "
                             + (process.communicate()[1] or b"").decode(errors="replace"))
        time.sleep(0.05)
    return process, warm_up


def topics_run(bootstrap: str, records: int, timeout_s: float,
               meter: CpuMeter) -> tuple[Run, list[int]]:
    return measure(bootstrap, records, RetryTopics(), timeout_s, meter), []


def store_run(bootstrap: str, records: int, url: str, timeout_s: float,
              meter: CpuMeter) -> tuple[Run, list[int]]:
    store = RetryStore(url)
    try:
        scheduler, warm_up = start_scheduler(bootstrap, url, store)
        try:
            run = measure(bootstrap, records, StoreBackend(store), timeout_s, meter)
        finally:
            scheduler.terminate()
            scheduler.wait(60)
            kafka.delete_topics(kafka.admin(bootstrap), [warm_up])
        rows = store.find(RowFilter(), limit=None)
        lateness = [r.dispatched_ms - r.due_ms for r in rows
                    if r.dispatched_ms is not None and r.group != "bench-warm-up"]
        return run, lateness
    finally:
        store.close()


def percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: start noida-db)")
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: start a server)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds of the three paths (default 3, 1 with --quick)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    records = args.records or (2_000 if args.quick else 20_000)
    args.runs = args.runs or (1 if args.quick else 3)
    timeout_s = 120.0 if args.quick else 900.0

    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60)
    postgres = None if args.postgres else DevPostgres(durable=True).start()
    bootstrap = args.bootstrap or (broker.bootstrap if broker else "")
    meter = CpuMeter(broker.pid if broker else None)
    paths = ("retry topics", "store: SQLite", "store: PostgreSQL")
    # One round measures each path once, back to back; ratios are taken within a round, since
    # this machine's speed drifts between minutes (the retry-topic path from 5k to 15k/s). The
    # order rotates from round to round, so that no path always runs first or last.
    rounds: list[dict[str, tuple[Run, list[int]]]] = []
    try:
        with TemporaryDirectory(prefix="redrive-bench-store-") as scratch:
            for number in range(args.runs):
                pg_url = args.postgres or (postgres.create_database() if postgres else "")
                sqlite_path = str(Path(scratch) / f"bench-{number}.db")
                runs: dict[str, Callable[[], tuple[Run, list[int]]]] = {
                    paths[0]: partial(topics_run, bootstrap, records, timeout_s, meter),
                    paths[1]: partial(store_run, bootstrap, records, sqlite_path, timeout_s,
                                      meter),
                    paths[2]: partial(store_run, bootstrap, records, pg_url, timeout_s, meter),
                }
                first = number % len(paths)
                rounds.append({path: runs[path]() for path in paths[first:] + paths[:first]})
    finally:
        if postgres is not None:
            postgres.stop()
        if broker is not None:
            broker.close()

    def median_rate(path: str) -> float:
        return statistics.median(r[path][0].rate for r in rounds)

    def median_ratio(path: str) -> float:
        return statistics.median(r[path][0].rate / r[paths[0]][0].rate for r in rounds)

    rows = []
    for path in paths:
        late = [ms for r in rounds for ms in r[path][1]]
        rows.append([path, records, f"{median_rate(path):,.0f}", f"{median_ratio(path):.2f}",
                     " ".join(f"{r[path][0].rate / r[paths[0]][0].rate:.2f}" for r in rounds),
                     f"{percentile(late, 0.5):.0f}" if late else "",
                     f"{percentile(late, 0.99):.0f}" if late else "",
                     sum(r[path][0].early for r in rounds),
                     sum(records - len(r[path][0].succeeded) for r in rounds)])
    print(table(["path", "records", "records/s (median)", "ratio to topics (median)",
                 "ratio per round", "lateness p50 ms", "lateness p99 ms", "early", "lost"], rows))
    lateness = [ms for r in rounds for path in paths[1:] for ms in r[path][1]]
    figures = {
        "records": records,
        "rounds": len(rounds),
        "topics_rate": round(median_rate(paths[0]), 1),
        "sqlite_rate": round(median_rate(paths[1]), 1),
        "postgres_rate": round(median_rate(paths[2]), 1),
        "sqlite_ratio": round(median_ratio(paths[1]), 3),
        "postgres_ratio": round(median_ratio(paths[2]), 3),
        "lateness_p50_ms": percentile(lateness, 0.5),
        "lateness_p99_ms": percentile(lateness, 0.99),
        "early": sum(run.early for r in rounds for run, _ in r.values()),
        "lost": sum(records - len(run.succeeded) for r in rounds for run, _ in r.values()),
    }
    print(f"\nlateness over {len(lateness)} stored retries in {len(rounds)} round(s)")
    if args.json:
        print(json.dumps(figures))
    sys.exit(0 if figures["lost"] == 0 and figures["early"] == 0 else 1)


if __name__ == "__main__":
    main()
