"""`make demo`: a PySpark streaming pipeline with retries, delays and a dead-letter topic.

It starts the embedded broker, produces a stream of order events, and runs a RetryPipeline whose
enrichment step fails transiently for some orders (they come back through the retry topics when
due), is rate-limited for a few (retried in place), and fails for good on malformed ones (they go
to the dead-letter topic). It ends with what happened to every record, checked against the
broker: nothing lost, nothing handled before it was due. Exit status 1 if either is not so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from redrive import headers as h
from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.policy import Backoff, InPlace, RetryPolicy
from redrive.spark import register
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline

TOPIC = "orders"
GROUP = "enricher"
PARTITIONS = 4


class UpstreamUnavailable(Exception):
    """The enrichment service answered 503: worth retrying later."""


class RateLimited(UpstreamUnavailable):
    """The enrichment service said 429: retry in place after a short pause."""


def failures_before_success(order_id: int) -> int:
    """How many times enrichment fails for an order before it works (stable per order)."""
    digest = int(hashlib.sha256(str(order_id).encode()).hexdigest()[:8], 16)
    bucket = digest % 1000
    if bucket < 5:
        return 9  # never works within the policy: dead-lettered as exhausted
    if bucket < 20:
        return 3
    if bucket < 60:
        return 2
    if bucket < 160:
        return 1
    return 0


def order_event(order_id: int) -> dict[str, Any]:
    amount: Any = round(5 + (order_id * 7919 % 50_000) / 100, 2)
    if order_id % 997 == 0:
        amount = "n/a"  # malformed: fails for good
    return {"order_id": order_id, "customer": f"c{order_id % 313}", "amount": amount}


def order_headers(order_id: int) -> list[tuple[str, bytes]]:
    pairs = [("source", b"shop-web")]
    if order_id % 1499 == 0:
        # a hand-made record with a corrupt redrive header: dead-lettered as malformed
        pairs.append((h.ATTEMPT, b"twice"))
    return pairs


def enrich(record: dict[str, Any]) -> dict[str, Any]:
    event = json.loads(record["value"])
    if not isinstance(event["amount"], int | float):
        raise ValueError(f"amount is not a number: {event['amount']!r}")
    order_id = int(event["order_id"])
    if order_id % 211 == 0 and record["attempt"] == 0 \
            and _first_try(order_id, record["offset"]):
        # the first try sees a 429; the pipeline's in-place retry gets past it
        raise RateLimited("429 from enrichment")
    if record["attempt"] < failures_before_success(order_id):
        raise UpstreamUnavailable("503 from enrichment")
    return {"order_id": order_id, "customer": event["customer"],
            "amount_cents": round(event["amount"] * 100), "attempt": record["attempt"]}


_SEEN: set[tuple[int, int]] = set()


def _first_try(order_id: int, offset: int) -> bool:
    key = (order_id, offset)
    if key in _SEEN:
        return False
    _SEEN.add(key)
    return True


def produce(bootstrap: str, count: int) -> None:
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {TOPIC: PARTITIONS})
    producer = kafka.producer(bootstrap)
    records = (kafka.OutRecord(TOPIC, json.dumps(order_event(i)).encode(), str(i).encode(),
                               order_headers(i))
               for i in range(1, count + 1))
    kafka.produce_confirmed(producer, records, timeout_s=120)


def dead_letters(spark: Any, bootstrap: str) -> dict[int, str]:
    frame = (spark.read.format("redrive-kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", f"{TOPIC}.{GROUP}.dlt")
             .option("includeHeaders", "true").load())
    found: dict[int, str] = {}
    for row in frame.select("value", "headers").collect():
        pairs = [(pair["key"], bytes(pair["value"])) for pair in row["headers"]]
        reason = (h.last(pairs, h.REASON) or b"?").decode()
        found[int(json.loads(row["value"])["order_id"])] = reason
    return found


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("redrive-demo")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def progress(started: float, total: int) -> Any:
    def report(batch_id: int, stats: PipelineStats) -> None:
        print(f"  batch {batch_id:>3}  {time.monotonic() - started:6.1f}s  "
              f"finished {stats.finished:>6}/{total}  succeeded {stats.succeeded:>6}  "
              f"retried {stats.retried:>5}  dead-lettered {stats.dead_lettered:>3}", flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of the embedded one")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="redrive-demo-"))
    broker = None if args.bootstrap else DevBroker("noida-db", data_dir=str(workdir / "broker"))
    try:
        if broker is not None:
            broker.start()
        bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
        started = time.monotonic()
        print(f"broker at {bootstrap}; producing {args.records} orders to '{TOPIC}'", flush=True)
        produce(bootstrap, args.records)
        spark = spark_session()
        policy = RetryPolicy(
            backoff=Backoff.sequence("1s,2s,3s"),
            not_retryable=[ValueError, KeyError],
            in_place=InPlace(on=RateLimited, retries=2, backoff=Backoff.fixed("50ms")),
        )
        output = workdir / "enriched"
        pipeline = RetryPipeline(
            spark, bootstrap, TOPIC, GROUP, policy, function=enrich,
            output_schema="order_id long, customer string, amount_cents long, attempt int",
            sink=str(output), checkpoint=str(workdir / "checkpoint"),
            trigger_interval="1 second", max_offsets_per_trigger=10_000,
            on_batch=progress(started, args.records))
        print(f"pipeline '{GROUP}' reads {', '.join(pipeline.consumed_topics)}", flush=True)
        stats = pipeline.run(until=lambda s: s.finished >= args.records, timeout_s=args.timeout)
        wall = time.monotonic() - started
        try:
            return report(spark, bootstrap, output, stats, args.records, wall)
        finally:
            spark.stop()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def report(spark: Any, bootstrap: str, output: Path, stats: PipelineStats, total: int,
           wall: float) -> int:
    succeeded = spark.read.parquet(str(output)).select("order_id", "attempt").collect()
    by_retries = Counter(int(row["attempt"]) for row in succeeded)
    succeeded_ids = {int(row["order_id"]) for row in succeeded}
    dead = dead_letters(spark, bootstrap)
    lost = sorted(set(range(1, total + 1)) - succeeded_ids - set(dead))
    rows: list[tuple[str, object]] = [("records produced", total)]
    for retries in sorted(by_retries):
        label = "succeeded on first try" if retries == 0 else f"succeeded after {retries} retries"
        rows.append((label, by_retries[retries]))
    for reason, count in sorted(Counter(dead.values()).items()):
        rows.append((f"dead-lettered: {reason}", count))
    rows += [("retried in place (429s)", stats.in_place_retries),
             ("duplicates in sink", len(succeeded) - len(succeeded_ids)),
             ("lost", len(lost)),
             ("records processed before due", stats.early),
             ("wall time", f"{wall:.1f}s")]
    width = max(len(label) for label, _ in rows)
    print("\nwhat happened to every record")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value:>8}")
    if lost:
        print(f"LOST: {lost[:20]}{' ...' if len(lost) > 20 else ''}")
    return 1 if lost or stats.early else 0


if __name__ == "__main__":
    sys.exit(main())
