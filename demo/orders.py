"""`make demo`: PySpark streaming pipelines with retries, delays and dead-letter topics.

It starts the embedded broker, produces a stream of order events, and runs two RetryPipelines:

1. validate, in the DataFrame form, as one Spark SQL query: it parses each order and checks it,
   with errors as a column (no Python per record); orders that are not JSON or whose amount is
   not a number go to the validator's dead-letter topic, as does a record with a corrupt redrive
   header, and valid orders are written to the `orders.valid` topic.
2. enrich, with a per-record Python function over `orders.valid`: it fails transiently for some
   orders (they come back through the retry topics when due), is rate-limited for a few (retried
   in place), and never succeeds for a few (dead-lettered once their retries are exhausted).

It ends with what happened to every record, counted per order id from the broker and the sink:
each id has exactly one outcome, the one the demo's rules give it, with one retry copy per retry
and none left waiting, and no sink row handled before its copy was due. Exit status 1 if not so;
an interrupted run (SIGINT 130, SIGTERM 143, --timeout 124) reports what is still pending.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

# Beside this file, which Python puts first on the path when it runs the demo.
import accounting
from accounting import Expected, Seen

from redrive import headers as h
from redrive import kafka, topics
from redrive.clock import now_ms
from redrive.dev.brokers import DevBroker
from redrive.policy import Backoff, InPlace, RetryPolicy, error_type
from redrive.spark import register, write_to_kafka
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.producers import drop_cached_producers

PARTITIONS = 4
ORDER_SCHEMA = "order_id long, customer string, amount string"
OUTPUT_SCHEMA = ("order_id long, customer string, amount_cents long, attempt int, "
                 "handled_ms long, due_ms long")
ENRICH_DELAYS = "1s,2s,3s"
TIMED_OUT = 124  # as timeout(1) says it


@dataclass(frozen=True)
class Names:
    """The run's topics and groups. Against a cluster of one's own (--bootstrap) they carry a
    suffix per run: a second run on fixed names would read the first one's records and offsets."""

    topic: str = "orders"
    validator: str = "validator"
    group: str = "enricher"

    @property
    def valid_topic(self) -> str:
        return f"{self.topic}.valid"

    @classmethod
    def for_run(cls, suffix: str) -> Names:
        return cls(f"orders-{suffix}", f"validator-{suffix}", f"enricher-{suffix}")


VALIDATE_POLICY = RetryPolicy(backoff=Backoff.sequence("1s"),
                              not_retryable=error_type("ParseError", "ValidationError"))


class UpstreamUnavailable(Exception):
    """The enrichment service answered 503: worth retrying later."""


class RateLimited(UpstreamUnavailable):
    """The enrichment service said 429: retry in place after a short pause."""


ENRICH_POLICY = RetryPolicy(
    backoff=Backoff.sequence(ENRICH_DELAYS),
    not_retryable=[ValueError, KeyError],
    in_place=InPlace(on=RateLimited, retries=2, backoff=Backoff.fixed("50ms")),
)
RETRIES = len(ENRICH_DELAYS.split(","))


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


def order_headers(order_id: int) -> list[tuple[str, bytes]]:
    pairs = [("source", b"shop-web")]
    if order_id % 1499 == 0:
        # a hand-made record with a corrupt redrive header: dead-lettered as malformed
        pairs.append((h.ATTEMPT, b"twice"))
    return pairs


def expected(order_id: int) -> Expected:
    """What the rules above make of an order; the header is checked before the value is read,
    and a cut event never reaches the amount check."""
    if order_id % 1499 == 0:
        return Expected("rejected", "malformed (MalformedHeader)")
    if order_id % 1201 == 0:
        return Expected("rejected", "not-retryable (ParseError)")
    if order_id % 997 == 0:
        return Expected("rejected", "not-retryable (ValidationError)")
    failures = failures_before_success(order_id)
    if failures > RETRIES:
        return Expected("dead", "exhausted (UpstreamUnavailable)", RETRIES)
    return Expected("succeeded", None, failures)


# Stage 1, as one Spark SQL query over the admitted batch: the parsed order, or an error saying
# why it is not one.
VALIDATE_SQL = f"""
SELECT topic, partition, offset, key,
       CASE WHEN o.order_id IS NULL
                 THEN named_struct('type', 'ParseError', 'message', 'not a JSON order')
            WHEN amount IS NULL
                 THEN named_struct('type', 'ValidationError',
                                   'message', concat('amount is not a number: ', o.amount))
       END AS error,
       to_json(named_struct('order_id', o.order_id, 'customer', o.customer,
                            'amount_cents', CAST(round(amount * 100) AS BIGINT))) AS value
FROM (SELECT *, try_cast(o.amount AS DOUBLE) AS amount
      FROM (SELECT *, from_json(CAST(value AS STRING), '{ORDER_SCHEMA}') AS o FROM {{batch}}))
"""


def to_valid_topic(bootstrap: str, valid_topic: str) -> Any:
    def sink(valid: Any, batch_id: int) -> None:
        write_to_kafka(valid.select("key", "value"), bootstrap, valid_topic)
    return sink


def enrich(record: dict[str, Any]) -> dict[str, Any]:
    """Stage 2, per record: the enrichment service call, which fails as failures_before_success
    says (and with a 429 on some first tries). The row keeps when it was handled and when its
    copy was due, so the report can check the due gate from the sink, not from the pipeline."""
    event = json.loads(record["value"])
    order_id = int(event["order_id"])
    if order_id % 211 == 0 and record["attempt"] == 0 \
            and _first_try(order_id, record["offset"]):
        # the first try sees a 429; the pipeline's in-place retry gets past it
        raise RateLimited("429 from enrichment")
    if record["attempt"] < failures_before_success(order_id):
        raise UpstreamUnavailable("503 from enrichment")
    return {"order_id": order_id, "customer": event["customer"],
            "amount_cents": event["amount_cents"], "attempt": record["attempt"],
            "handled_ms": now_ms(), "due_ms": h.read_due(record["headers"])}


_SEEN: set[tuple[int, int]] = set()


def _first_try(order_id: int, offset: int) -> bool:
    key = (order_id, offset)
    if key in _SEEN:
        return False
    _SEEN.add(key)
    return True


def produce(bootstrap: str, names: Names, count: int) -> None:
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {names.topic: PARTITIONS, names.valid_topic: PARTITIONS})
    producer = kafka.producer(bootstrap)
    records = (kafka.OutRecord(names.topic, order_event(i), str(i).encode(), order_headers(i))
               for i in range(1, count + 1))
    kafka.produce_confirmed(producer, records, timeout_s=120)


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


class Interrupts:
    """SIGINT and SIGTERM for the whole demo. While the stages run, a signal only sets the flag:
    the running stage sees it (its `until`), stops between batches, the next stage is skipped,
    and the report says what is pending. Anywhere else it raises SystemExit, so the `finally`
    blocks stop Spark and the broker and remove the work directory; once cleaning up has begun
    a second signal is only noted, or it would cut the clean-up short."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.timed_out = False
        self.deferred = False
        self.cleaning = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
            print(f"\n{signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
        if not self.deferred and not self.cleaning:
            raise SystemExit(128 + signum)

    @property
    def stopped(self) -> bool:
        return self.signal is not None or self.timed_out

    def describe(self) -> str:
        if self.signal is not None:
            return f"interrupted by {signal.Signals(self.signal).name}"
        return "stopped by --timeout"

    def exit_status(self) -> int:
        return 128 + self.signal if self.signal is not None else TIMED_OUT


def run_stage(pipeline: RetryPipeline, done: Callable[[PipelineStats], bool],
              timeout_s: float, interrupts: Interrupts) -> PipelineStats:
    """pipeline.run() in a thread of its own, where it leaves signals to this process's handler
    (Interrupts), so the demo knows a stage stopped on a signal, not because it was done."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["stats"] = pipeline.run(
                until=lambda stats: interrupts.signal is not None or done(stats),
                timeout_s=timeout_s)
        except BaseException as exc:  # handed to the main thread, which raises it
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"pipeline-{pipeline.group}", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # short waits: the main thread must run the signal handler
    if "error" in outcome:
        raise outcome["error"]
    stats: PipelineStats = outcome["stats"]
    if interrupts.signal is None and not done(stats):
        interrupts.timed_out = True
    return stats


def main() -> int:
    interrupts = Interrupts()
    interrupts.install()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of the embedded one; "
                        "the run's topics and groups get a suffix of their own, and stay there")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per stage")
    args = parser.parse_args()
    names = Names.for_run(uuid.uuid4().hex[:8]) if args.bootstrap else Names()

    workdir = Path(tempfile.mkdtemp(prefix="redrive-demo-"))
    broker = None if args.bootstrap else DevBroker("noida-db", data_dir=str(workdir / "broker"))
    try:
        if broker is not None:
            broker.start()
        bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
        started = time.monotonic()
        print(f"broker at {bootstrap}; producing {args.records} orders to '{names.topic}'",
              flush=True)
        produce(bootstrap, names, args.records)
        spark = spark_session()
        # A local SparkContext puts its own SIGINT handler in (it cancels the jobs and raises
        # KeyboardInterrupt): Ctrl-C must stop the stage between batches, as SIGTERM does.
        interrupts.install()
        try:
            output = workdir / "enriched"
            stats = run_stages(spark, bootstrap, names, workdir, output, args, started,
                               interrupts)
            wall = time.monotonic() - started
            status = report(spark, bootstrap, names, output, stats, args.records, wall,
                            interrupts)
            return interrupts.exit_status() if interrupts.stopped else status
        finally:
            interrupts.cleaning = True
            spark.stop()
            # On a classic session the batches' producers live in this process: closed before
            # the embedded broker stops, they do not log its refused connections at exit.
            drop_cached_producers()
    finally:
        interrupts.cleaning = True
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run_stages(spark: Any, bootstrap: str, names: Names, workdir: Path, output: Path,
               args: argparse.Namespace, started: float,
               interrupts: Interrupts) -> list[PipelineStats]:
    """Both stages, the second only when the first ended on its own; their stats."""
    interrupts.deferred = True
    try:
        if interrupts.signal is not None:
            return []
        validation = run_validation(spark, bootstrap, names, workdir, args, started, interrupts)
        if interrupts.stopped:
            print(f"\nrun {interrupts.describe()} in stage 1: stage 2 skipped", flush=True)
            return [validation]
        enrichment = run_enrichment(spark, bootstrap, names, workdir, output,
                                    validation.succeeded, args, started, interrupts)
        if interrupts.stopped:
            print(f"\nrun {interrupts.describe()} in stage 2", flush=True)
        return [validation, enrichment]
    finally:
        interrupts.deferred = False


def run_validation(spark: Any, bootstrap: str, names: Names, workdir: Path,
                   args: argparse.Namespace, started: float,
                   interrupts: Interrupts) -> PipelineStats:
    """Stage 1; its stats say how many orders it found valid."""
    pipeline = RetryPipeline(
        spark, bootstrap, names.topic, names.validator, VALIDATE_POLICY, transform=VALIDATE_SQL,
        sink=to_valid_topic(bootstrap, names.valid_topic),
        checkpoint=str(workdir / "checkpoint-validate"),
        trigger_interval="1 second", max_offsets_per_trigger=10_000,
        on_batch=progress(started, args.records))
    print(f"\n1. validate (DataFrame form, Spark SQL) reads "
          f"{', '.join(pipeline.consumed_topics)}", flush=True)
    return run_stage(pipeline, lambda s: s.finished >= args.records, args.timeout, interrupts)


def run_enrichment(spark: Any, bootstrap: str, names: Names, workdir: Path, output: Path,
                   validated: int, args: argparse.Namespace, started: float,
                   interrupts: Interrupts) -> PipelineStats:
    """Stage 2, over the valid orders."""
    pipeline = RetryPipeline(
        spark, bootstrap, names.valid_topic, names.group, ENRICH_POLICY, function=enrich,
        output_schema=OUTPUT_SCHEMA, sink=str(output),
        checkpoint=str(workdir / "checkpoint-enrich"),
        trigger_interval="1 second", max_offsets_per_trigger=10_000,
        on_batch=progress(started, validated))
    print(f"\n2. enrich (a Python function per record) reads "
          f"{', '.join(pipeline.consumed_topics)}", flush=True)
    return run_stage(pipeline, lambda s: s.finished >= validated, args.timeout, interrupts)


def read_topic(spark: Any, bootstrap: str, topic: str, existing: set[str]) -> list[Any]:
    """Every record of the topic, without the due gate; none when a stopped run never made it."""
    if topic not in existing:
        return []
    rows: list[Any] = (spark.read.format("redrive-kafka")
                       .option("kafka.bootstrap.servers", bootstrap)
                       .option("subscribe", topic).option("includeHeaders", "true").load()
                       .select("key", "headers").collect())
    return rows


def keyed(row: Any) -> tuple[int, list[tuple[str, bytes]]]:
    pairs = [(pair["key"], bytes(pair["value"])) for pair in row["headers"] or []]
    return int(bytes(row["key"])), pairs


def dead_letter_reason(pairs: list[tuple[str, bytes]]) -> str:
    reason = (h.last(pairs, h.REASON) or b"?").decode()
    kind = (h.last(pairs, h.ERROR_TYPE) or b"").decode().rpartition(".")[2]
    return f"{reason} ({kind})" if kind else reason


def gather(spark: Any, bootstrap: str, names: Names,
           output: Path) -> tuple[dict[int, Seen], list[Any], dict[str, int]]:
    """What the broker and the sink hold, per order id; the sink's rows; copies per retry topic."""
    existing = set(kafka.topic_partitions(kafka.admin(bootstrap)))
    seen: dict[int, Seen] = defaultdict(Seen)
    validate_plan = topics.plan(VALIDATE_POLICY, names.topic, names.validator)
    enrich_plan = topics.plan(ENRICH_POLICY, names.valid_topic, names.group)
    for topic in validate_plan.retry_topic_names:
        for row in read_topic(spark, bootstrap, topic, existing):
            seen[keyed(row)[0]].validator_retry_copies += 1
    for row in read_topic(spark, bootstrap, validate_plan.dead_letter or "", existing):
        order_id, pairs = keyed(row)
        seen[order_id].rejected.append(dead_letter_reason(pairs))
    for row in read_topic(spark, bootstrap, names.valid_topic, existing):
        seen[int(bytes(row["key"]))].valid += 1
    copies: dict[str, int] = {}
    for retry_topic in enrich_plan.retry_topics:
        rows = read_topic(spark, bootstrap, retry_topic.name, existing)
        copies[retry_topic.name] = len(rows)
        for row in rows:
            order_id, pairs = keyed(row)
            attempt = h.last(pairs, h.ATTEMPT)
            seen[order_id].retry_copies[int(attempt) if attempt else retry_topic.retries[0]] += 1
    for row in read_topic(spark, bootstrap, enrich_plan.dead_letter or "", existing):
        order_id, pairs = keyed(row)
        seen[order_id].dead.append(dead_letter_reason(pairs))
    sunk: list[Any] = []
    if output.exists() and any(output.rglob("*.parquet")):
        sunk = (spark.read.schema(OUTPUT_SCHEMA).parquet(str(output))
                .select("order_id", "attempt", "handled_ms", "due_ms").collect())
    for row in sunk:
        seen[int(row["order_id"])].succeeded.append(int(row["attempt"]))
    return dict(seen), sunk, copies


def report(spark: Any, bootstrap: str, names: Names, output: Path, stats: list[PipelineStats],
           total: int, wall: float, interrupts: Interrupts) -> int:
    seen, sunk, copies = gather(spark, bootstrap, names, output)
    result = accounting.tally(seen, range(1, total + 1), expected, interrupts.stopped)
    rejected = Counter(reason for found in seen.values() for reason in found.rejected)
    dead = Counter(reason for found in seen.values() for reason in found.dead)
    by_retries = Counter(attempt for found in seen.values() for attempt in found.succeeded)
    rows: list[tuple[str, object]] = [("records produced", total)]
    for reason, count in sorted(rejected.items()):
        rows.append((f"1. dead-lettered: {reason}", count))
    rows.append((f"1. valid, written to {names.valid_topic}",
                 sum(found.valid for found in seen.values())))
    for retries in sorted(by_retries):
        label = "succeeded on first try" if retries == 0 else f"succeeded after {retries} retries"
        rows.append((f"2. {label}", by_retries[retries]))
    for reason, count in sorted(dead.items()):
        rows.append((f"2. dead-lettered: {reason}", count))
    for topic, count in copies.items():
        rows.append((f"2. retry copies in {topic}", count))
    in_place = sum(s.in_place_retries for s in stats)
    early = sum(s.early for s in stats)
    handled_early = accounting.handled_before_due(
        (int(row["attempt"]), row["handled_ms"], row["due_ms"]) for row in sunk)
    rows += [("2. retried in place (429s, pipeline's count)", in_place),
             ("handled before due (sink: handled < due)", handled_early),
             ("processed before due (pipeline's count)", early)]
    rows += [(problem, result.categories[problem]) for problem in accounting.PROBLEMS
             if problem != accounting.NO_INPUT or result.categories[problem]]
    if interrupts.stopped:
        rows.append((accounting.PENDING, result.categories[accounting.PENDING]))
    rows.append(("wall time", f"{wall:.1f}s"))
    width = max(len(label) for label, _ in rows)
    title = "what happened to every record, per order id from the broker and the sink"
    if interrupts.stopped:
        title += f" (run {interrupts.describe()})"
    print(f"\n{title}")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value:>8}")
    for category, ids in result.examples.items():
        print(f"{category.upper()}: {ids[:20]}{' ...' if len(ids) > 20 else ''}")
    return 1 if result.failed or handled_early or early else 0


if __name__ == "__main__":
    sys.exit(main())
