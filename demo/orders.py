"""`make demo`: PySpark streaming pipelines with retries, delays and dead-letter topics.

It starts the embedded broker, produces a stream of order events, and runs two RetryPipelines:

1. validate, in the DataFrame form: Spark SQL parses each order and checks it, with errors as a
   column (no Python per record); orders that are not JSON or whose amount is not a number go to
   the validator's dead-letter topic, as does a record with a corrupt redrive header, and valid
   orders are written to the `orders.valid` topic.
2. enrich, with a per-record Python function over `orders.valid`: it fails transiently for some
   orders (they come back through the retry topics when due), is rate-limited for a few (retried
   in place), and never succeeds for a few (dead-lettered once their retries are exhausted).

It ends with what happened to every record, checked against the broker and the sink: nothing
lost, nothing written twice, nothing handled before it was due. Exit status 1 if not so.
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
from redrive.policy import Backoff, InPlace, RetryPolicy, error_type
from redrive.spark import register, write_to_kafka
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.sql import functions
from redrive.spark.writer import drop_cached_producers

TOPIC = "orders"
VALID_TOPIC = "orders.valid"
VALIDATOR = "validator"
GROUP = "enricher"
PARTITIONS = 4
ORDER_SCHEMA = "order_id long, customer string, amount string"


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


def order_event(order_id: int) -> bytes:
    amount: Any = round(5 + (order_id * 7919 % 50_000) / 100, 2)
    if order_id % 997 == 0:
        amount = "n/a"  # fails validation for good
    event = json.dumps({"order_id": order_id, "customer": f"c{order_id % 313}", "amount": amount})
    if order_id % 1201 == 0:
        event = event[:-4]  # cut short: not JSON
    return event.encode()


def validate(batch: Any) -> Any:
    """Stage 1, in Spark SQL: the parsed order, or an error saying why it is not one."""
    F = functions(batch)
    order = F.from_json(F.col("value").cast("string"), ORDER_SCHEMA)
    amount = order.getField("amount").try_cast("double")

    def error(kind: str, message: Any) -> Any:
        return F.struct(F.lit(kind).alias("type"), message.alias("message"))

    failure = (F.when(order.getField("order_id").isNull(),
                      error("ParseError", F.lit("not a JSON order")))
               .when(amount.isNull(),
                     error("ValidationError", F.concat(F.lit("amount is not a number: "),
                                                       order.getField("amount")))))
    return batch.select(
        "topic", "partition", "offset", failure.alias("error"),
        F.col("key"),
        F.to_json(F.struct(order.getField("order_id").alias("order_id"),
                           order.getField("customer").alias("customer"),
                           F.round(amount * 100).cast("long").alias("amount_cents")))
        .alias("value"))


def to_valid_topic(bootstrap: str) -> Any:
    def sink(valid: Any, batch_id: int) -> None:
        write_to_kafka(valid.select("key", "value"), bootstrap, VALID_TOPIC)
    return sink


def order_headers(order_id: int) -> list[tuple[str, bytes]]:
    pairs = [("source", b"shop-web")]
    if order_id % 1499 == 0:
        # a hand-made record with a corrupt redrive header: dead-lettered as malformed
        pairs.append((h.ATTEMPT, b"twice"))
    return pairs


def enrich(record: dict[str, Any]) -> dict[str, Any]:
    """Stage 2, per record: the enrichment service call, which fails as failures_before_success
    says (and with a 429 on some first tries)."""
    event = json.loads(record["value"])
    order_id = int(event["order_id"])
    if order_id % 211 == 0 and record["attempt"] == 0 \
            and _first_try(order_id, record["offset"]):
        # the first try sees a 429; the pipeline's in-place retry gets past it
        raise RateLimited("429 from enrichment")
    if record["attempt"] < failures_before_success(order_id):
        raise UpstreamUnavailable("503 from enrichment")
    return {"order_id": order_id, "customer": event["customer"],
            "amount_cents": event["amount_cents"], "attempt": record["attempt"]}


_SEEN: set[tuple[int, int]] = set()


def _first_try(order_id: int, offset: int) -> bool:
    key = (order_id, offset)
    if key in _SEEN:
        return False
    _SEEN.add(key)
    return True


def produce(bootstrap: str, count: int) -> None:
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {TOPIC: PARTITIONS, VALID_TOPIC: PARTITIONS})
    producer = kafka.producer(bootstrap)
    records = (kafka.OutRecord(TOPIC, order_event(i), str(i).encode(), order_headers(i))
               for i in range(1, count + 1))
    kafka.produce_confirmed(producer, records, timeout_s=120)


def read_topic(spark: Any, bootstrap: str, topic: str) -> list[Any]:
    return (spark.read.format("redrive-kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true").load()
            .select("key", "headers").collect())


def dead_letters(spark: Any, bootstrap: str, topic: str, group: str) -> dict[int, str]:
    """Order id (the record's key) -> dead-letter reason and error type."""
    found: dict[int, str] = {}
    for row in read_topic(spark, bootstrap, f"{topic}.{group}.dlt"):
        pairs = [(pair["key"], bytes(pair["value"])) for pair in row["headers"]]
        reason = (h.last(pairs, h.REASON) or b"?").decode()
        kind = (h.last(pairs, h.ERROR_TYPE) or b"").decode().rpartition(".")[2]
        found[int(bytes(row["key"]))] = f"{reason} ({kind})" if kind else reason
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
        try:
            validated = run_validation(spark, bootstrap, workdir, args, started)
            output = workdir / "enriched"
            stats = run_enrichment(spark, bootstrap, workdir, output, validated, args, started)
            wall = time.monotonic() - started
            return report(spark, bootstrap, output, stats, args.records, wall)
        finally:
            spark.stop()
            # On a classic session the batches' producers live in this process: closed before
            # the embedded broker stops, they do not log its refused connections at exit.
            drop_cached_producers()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run_validation(spark: Any, bootstrap: str, workdir: Path, args: argparse.Namespace,
                   started: float) -> int:
    """Stage 1; returns how many orders it found valid."""
    policy = RetryPolicy(backoff=Backoff.sequence("1s"),
                         not_retryable=error_type("ParseError", "ValidationError"))
    pipeline = RetryPipeline(
        spark, bootstrap, TOPIC, VALIDATOR, policy, transform=validate,
        sink=to_valid_topic(bootstrap), checkpoint=str(workdir / "checkpoint-validate"),
        trigger_interval="1 second", max_offsets_per_trigger=10_000,
        on_batch=progress(started, args.records))
    print(f"\n1. validate (DataFrame form, Spark SQL) reads "
          f"{', '.join(pipeline.consumed_topics)}", flush=True)
    stats = pipeline.run(until=lambda s: s.finished >= args.records, timeout_s=args.timeout)
    return stats.succeeded


def run_enrichment(spark: Any, bootstrap: str, workdir: Path, output: Path, validated: int,
                   args: argparse.Namespace, started: float) -> PipelineStats:
    """Stage 2, over the valid orders."""
    policy = RetryPolicy(
        backoff=Backoff.sequence("1s,2s,3s"),
        not_retryable=[ValueError, KeyError],
        in_place=InPlace(on=RateLimited, retries=2, backoff=Backoff.fixed("50ms")),
    )
    pipeline = RetryPipeline(
        spark, bootstrap, VALID_TOPIC, GROUP, policy, function=enrich,
        output_schema="order_id long, customer string, amount_cents long, attempt int",
        sink=str(output), checkpoint=str(workdir / "checkpoint-enrich"),
        trigger_interval="1 second", max_offsets_per_trigger=10_000,
        on_batch=progress(started, validated))
    print(f"\n2. enrich (a Python function per record) reads "
          f"{', '.join(pipeline.consumed_topics)}", flush=True)
    return pipeline.run(until=lambda s: s.finished >= validated, timeout_s=args.timeout)


def report(spark: Any, bootstrap: str, output: Path, stats: PipelineStats, total: int,
           wall: float) -> int:
    succeeded = spark.read.parquet(str(output)).select("order_id", "attempt").collect()
    by_retries = Counter(int(row["attempt"]) for row in succeeded)
    succeeded_ids = {int(row["order_id"]) for row in succeeded}
    rejected = dead_letters(spark, bootstrap, TOPIC, VALIDATOR)
    valid = Counter(int(bytes(row["key"])) for row in read_topic(spark, bootstrap, VALID_TOPIC))
    dead = dead_letters(spark, bootstrap, VALID_TOPIC, GROUP)
    lost = sorted(set(range(1, total + 1)) - succeeded_ids - set(rejected) - set(dead))
    twice = (len(succeeded) - len(succeeded_ids)) + sum(n - 1 for n in valid.values())
    rows: list[tuple[str, object]] = [("records produced", total)]
    for reason, count in sorted(Counter(rejected.values()).items()):
        rows.append((f"1. dead-lettered: {reason}", count))
    rows.append((f"1. valid, written to {VALID_TOPIC}", len(valid)))
    for retries in sorted(by_retries):
        label = "succeeded on first try" if retries == 0 else f"succeeded after {retries} retries"
        rows.append((f"2. {label}", by_retries[retries]))
    for reason, count in sorted(Counter(dead.values()).items()):
        rows.append((f"2. dead-lettered: {reason}", count))
    rows += [("2. retried in place (429s)", stats.in_place_retries),
             ("written twice (sink or valid topic)", twice),
             ("lost", len(lost)),
             ("records processed before due", stats.early),
             ("wall time", f"{wall:.1f}s")]
    width = max(len(label) for label, _ in rows)
    print("\nwhat happened to every record")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value:>8}")
    if lost:
        print(f"LOST: {lost[:20]}{' ...' if len(lost) > 20 else ''}")
    return 1 if lost or twice or stats.early else 0


if __name__ == "__main__":
    sys.exit(main())
