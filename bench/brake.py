"""What a dead-letter limit costs a Spark pipeline's batch that does not trip it.

    python bench/brake.py [--records N] [--runs N] [--bootstrap HOST:PORT] [--json]

Starts its own noida-db unless --bootstrap is given. Fills a 2-partition topic with --records
values and runs a DataFrame-form RetryPipeline over it in one micro-batch, twice per case: without
a limit (the baseline) and with `DeadLetterLimit(ratio=0.5, consecutive=100)`, which the batch
does not pass. Two cases: every record succeeds (the brake counts records per partition), and one
in a hundred is dead-lettered (the brake fetches the records' offsets, whose order counts). Prints
the runs' times, the batch's `brake` step and the ratio of the braked run's records/s to the
baseline's in the same round; medians of --runs rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.policy import DeadLetterLimit, RetryPolicy, error_type
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.sql import functions

PARTITIONS = 2
LIMIT = DeadLetterLimit(ratio=0.5, consecutive=100)
CASES = {"no failures": 0, "1 % dead-lettered": 100}  # one record in every N fails (0: none)


def fill(bootstrap: str, records: int) -> str:
    topic = f"bench-brake-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: PARTITIONS})
    producer = kafka.producer(bootstrap, overrides={"linger.ms": 20, "batch.size": 1_000_000})
    for i in range(records):
        kafka.produce(producer, kafka.OutRecord(topic, b"%d" % i, partition=i % PARTITIONS))
    if producer.flush(120) != 0:
        raise SystemExit(f"filling {topic}: records still unconfirmed after 120 s")
    return topic


class Parse:
    """The transform: every `every`-th record of each partition (by its value, which says its
    place) fails with a ParseError; none with `every` 0."""

    def __init__(self, every: int) -> None:
        self.every = every

    def __call__(self, frame: Any) -> Any:
        F = functions(frame)
        value = F.col("value").cast("string").cast("long")
        error = F.struct(F.lit("ParseError").alias("type"), F.lit("bad").alias("message"))
        failed = ((F.floor(value / PARTITIONS) % self.every == 0) if self.every
                  else F.lit(False))
        return frame.select("topic", "partition", "offset", value.alias("amount"),
                            F.when(failed, error).alias("error"))


def noop_sink(frame: Any, batch_id: int) -> None:
    frame.write.format("noop").mode("overwrite").save()


def run(spark: Any, bootstrap: str, topic: str, records: int, every: int, braked: bool,
        workdir: Path) -> tuple[float, float]:
    group = f"bench-brake-{uuid.uuid4().hex[:8]}"
    policy = RetryPolicy(not_retryable=error_type("ParseError"),
                         dead_letter_limit=LIMIT if braked else None)
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, transform=Parse(every),
                             sink=noop_sink, checkpoint=str(workdir / group),
                             max_offsets_per_trigger=records,
                             trigger_interval="100 milliseconds")
    pipeline.ensure_topics()
    started = time.perf_counter()
    stats = pipeline.run(until=lambda s: s.finished >= records, timeout_s=600)
    took = time.perf_counter() - started
    dead = -(-records // PARTITIONS // every) * PARTITIONS if every else 0
    if stats.finished < records or abs(stats.dead_lettered - dead) > PARTITIONS:
        raise SystemExit(f"{group}: finished {stats.finished} of {records}, dead-lettered "
                         f"{stats.dead_lettered} (about {dead} expected)")
    kafka.delete_topics(kafka.admin(bootstrap), [name for plan in pipeline.plans.values()
                                                 for name in plan.created_topics])
    return took, stats.step_seconds.get("brake", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="use this cluster instead of starting noida-db")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the source's readers run in this Python
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("redrive-bench-brake")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60.0)
    bootstrap = broker.bootstrap if broker is not None else args.bootstrap
    rounds: dict[str, list[tuple[float, float, float, float]]] = {case: [] for case in CASES}
    try:
        topic = fill(bootstrap, args.records)
        with tempfile.TemporaryDirectory(prefix="redrive-bench-brake-") as workdir:
            run(spark, bootstrap, topic, args.records, 100, True, Path(workdir))  # warm-up
            for round_ in range(args.runs):
                for case, every in CASES.items():
                    # The order alternates from round to round: the machine's speed drifts.
                    order = (False, True) if round_ % 2 == 0 else (True, False)
                    took = {braked: run(spark, bootstrap, topic, args.records, every, braked,
                                        Path(workdir)) for braked in order}
                    (plain, _), (braked_s, step) = took[False], took[True]
                    rounds[case].append((plain, braked_s, step, plain / braked_s))
                    print(f"round {round_ + 1}, {case}: no limit {plain:.1f} s, limit "
                          f"{braked_s:.1f} s (brake step {step:.2f} s)", file=sys.stderr,
                          flush=True)
    finally:
        if broker is not None:
            broker.close()
        spark.stop()
    figures = {}
    print(f"{args.records:,} records in one batch of {PARTITIONS} partitions, medians of "
          f"{args.runs} rounds; limit {LIMIT.describe()}")
    print(f"{'case':<18}  {'no limit s':>10}  {'limit s':>7}  {'brake step s':>12}  "
          f"{'records/s ratio':>15}")
    for case, values in rounds.items():
        plain, braked_s, step, ratio = (statistics.median(v[i] for v in values)
                                        for i in range(4))
        figures[case] = {"no_limit_s": round(plain, 2), "limit_s": round(braked_s, 2),
                         "brake_step_s": round(step, 2), "ratio": round(ratio, 2),
                         "ratio_runs": [round(v[3], 2) for v in values]}
        print(f"{case:<18}  {plain:>10.1f}  {braked_s:>7.1f}  {step:>12.2f}  {ratio:>15.2f}")
    if args.json:
        print(json.dumps({"records": args.records, "brake": figures}))


if __name__ == "__main__":
    main()
