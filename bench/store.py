"""Benchmark of the store retry path against the retry-topic path, on SQLite and PostgreSQL.

    python bench/store.py [--quick] [--bootstrap HOST:PORT] [--postgres URL] [--json]

Starts its own noida-db unless --bootstrap is given, and its own PostgreSQL server (durable:
fsync on, as SQLite's synchronous=FULL) unless --postgres is given. The workload is the same for
every path: N records that each fail their first delivery and succeed when retried after a 100 ms
backoff. Throughput is N over the time from the first handler call to the last retried success.
The store's scheduler runs as it is deployed: `redrive store run`, a process of its own.

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
from pathlib import Path
from tempfile import TemporaryDirectory

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


def measure(bootstrap: str, records: int, backend: RetryBackend, timeout_s: float) -> Run:
    topic = fill(bootstrap, records)
    run = Run(records)
    consumer = RetryingConsumer(bootstrap, topic, f"bench-{uuid.uuid4().hex[:8]}",
                                RetryPolicy(backoff=Backoff.fixed(BACKOFF)), run.handle,
                                config=GROUP_CONFIG, retry_backend=backend)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not run.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer.stop()
    thread.join(60)
    return run


def start_scheduler(bootstrap: str, url: str, store: RetryStore) -> subprocess.Popen[bytes]:
    """`redrive store run` on the store, returned once it has republished a first row (so its
    connections are made before the measured run)."""
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
    return process


def store_run(bootstrap: str, records: int, url: str,
              timeout_s: float) -> tuple[Run, list[int]]:
    store = RetryStore(url)
    try:
        scheduler = start_scheduler(bootstrap, url, store)
        try:
            run = measure(bootstrap, records, StoreBackend(store), timeout_s)
        finally:
            scheduler.terminate()
            scheduler.wait(60)
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    records = args.records or (2_000 if args.quick else 20_000)
    timeout_s = 120.0 if args.quick else 900.0

    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60)
    postgres = None if args.postgres else DevPostgres(durable=True).start()
    bootstrap = args.bootstrap or (broker.bootstrap if broker else "")
    try:
        with TemporaryDirectory(prefix="redrive-bench-store-") as scratch:
            pg_url = args.postgres or (postgres.create_database() if postgres else "")
            runs: dict[str, Callable[[], tuple[Run, list[int]]]] = {
                "retry topics": lambda: (measure(bootstrap, records, RetryTopics(), timeout_s),
                                         []),
                "store: SQLite": lambda: store_run(bootstrap, records,
                                                   str(Path(scratch) / "bench.db"), timeout_s),
                "store: PostgreSQL": lambda: store_run(bootstrap, records, pg_url, timeout_s),
            }
            results = {name: measure_one() for name, measure_one in runs.items()}
    finally:
        if postgres is not None:
            postgres.stop()
        if broker is not None:
            broker.close()

    base = results["retry topics"][0].rate
    lateness = results["store: SQLite"][1] + results["store: PostgreSQL"][1]
    rows = []
    for name, (run, late) in results.items():
        rows.append([name, records, f"{run.rate:,.0f}", f"{run.rate / base:.2f}",
                     f"{percentile(late, 0.5):.0f}" if late else "",
                     f"{percentile(late, 0.99):.0f}" if late else "", run.early,
                     records - len(run.succeeded)])
    print(table(["path", "records", "records/s", "ratio to topics", "lateness p50 ms",
                  "lateness p99 ms", "early", "lost"], rows))
    figures = {
        "records": records,
        "topics_rate": round(base, 1),
        "sqlite_rate": round(results["store: SQLite"][0].rate, 1),
        "postgres_rate": round(results["store: PostgreSQL"][0].rate, 1),
        "sqlite_ratio": round(results["store: SQLite"][0].rate / base, 3),
        "postgres_ratio": round(results["store: PostgreSQL"][0].rate / base, 3),
        "lateness_p50_ms": percentile(lateness, 0.5),
        "lateness_p99_ms": percentile(lateness, 0.99),
        "early": sum(run.early for run, _ in results.values()),
        "lost": sum(records - len(run.succeeded) for run, _ in results.values()),
    }
    print(f"\nlateness over {len(lateness)} stored retries: "
          f"p50 {statistics.median(lateness) if lateness else float('nan'):.0f} ms")
    if args.json:
        print(json.dumps(figures))
    sys.exit(0 if figures["lost"] == 0 and figures["early"] == 0 else 1)


if __name__ == "__main__":
    main()
