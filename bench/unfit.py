"""What finding records a DataFrame transform cannot compute costs a RetryPipeline batch.

    python bench/unfit.py [--records N] [--unfit 0,1,4] [--runs N] [--bootstrap HOST:PORT] [--json]

Starts its own noida-db unless --bootstrap is given. For each count in --unfit it fills a
2-partition topic with --records integer values, that many of them 'abc' (spread over the topic
and its partitions in turn), and
runs a DataFrame-form RetryPipeline over it in one micro-batch: the transform casts each value to
int under ANSI mode, so each 'abc' fails the whole job until the pipeline has isolated it. It
prints the run's time, the batch's `isolate` step and the ratio of the run's time to the run with
no such record (measured in the same round). Medians of --runs rounds. It does not count Spark
jobs.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from redrive.policy import RetryPolicy, error_type
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.sql import functions

PARTITIONS = 2


def unfit_indices(records: int, unfit: int) -> set[int]:
    """Which records are 'abc': the k-th in the middle of the k-th share of the topic, moved to
    the next index whose partition (index % PARTITIONS) is k % PARTITIONS, so that they fall in
    every partition in turn and the search halves more than one partition's range."""
    if not unfit:
        return set()
    every = records // unfit
    middles = (k * every + every // 2 for k in range(unfit))
    return {i + (k - i) % PARTITIONS for k, i in enumerate(middles)}


def fill(bootstrap: str, records: int, unfit: int) -> str:
    topic = f"bench-unfit-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: PARTITIONS})
    producer = kafka.producer(bootstrap, overrides={"linger.ms": 20, "batch.size": 1_000_000})
    bad = unfit_indices(records, unfit)
    for i in range(records):
        kafka.produce(producer, kafka.OutRecord(topic, b"abc" if i in bad else b"%d" % i,
                                                partition=i % PARTITIONS))
    if producer.flush(120) != 0:
        raise SystemExit(f"filling {topic}: records still unconfirmed after 120 s")
    return topic


def amounts(frame: Any) -> Any:
    F = functions(frame)
    return frame.select("topic", "partition", "offset",
                        F.col("value").cast("string").cast("int").alias("amount"),
                        F.lit(None).cast("struct<type:string,message:string>").alias("error"))


def noop_sink(frame: Any, batch_id: int) -> None:
    frame.write.format("noop").mode("overwrite").save()


def run(spark: Any, bootstrap: str, records: int, unfit: int, workdir: Path) -> tuple[float, float]:
    topic = fill(bootstrap, records, unfit)
    group = f"bench-unfit-{uuid.uuid4().hex[:8]}"
    policy = RetryPolicy(not_retryable=error_type("CAST_INVALID_INPUT"))
    pipeline = RetryPipeline(spark, bootstrap, topic, group, policy, transform=amounts,
                             sink=noop_sink, checkpoint=str(workdir / group),
                             max_offsets_per_trigger=records,
                             trigger_interval="100 milliseconds")
    started = time.perf_counter()
    stats = pipeline.run(until=lambda s: s.finished >= records, timeout_s=600)
    took = time.perf_counter() - started
    if stats.finished < records or stats.dead_lettered != unfit:
        raise SystemExit(f"{unfit} unfit records: finished {stats.finished} of {records}, "
                         f"dead-lettered {stats.dead_lettered}")
    return took, stats.step_seconds.get("isolate", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="use this cluster instead of starting noida-db")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--unfit", default="0,1,4", help="counts of unfit records to measure")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    counts = sorted({0, *(int(part) for part in args.unfit.split(","))})
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the source's readers run in this Python
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("redrive-bench-unfit")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    # Each unfit record fails jobs on purpose: neither the JVM's log nor PySpark's log of each
    # error raised (its whole JVM trace) is wanted here.
    spark.sparkContext.setLogLevel("OFF")
    logging.getLogger("DataFrameQueryContextLogger").disabled = True
    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60.0)
    bootstrap = broker.bootstrap if broker is not None else args.bootstrap
    rounds: dict[int, list[tuple[float, float, float]]] = {count: [] for count in counts}
    try:
        with tempfile.TemporaryDirectory(prefix="redrive-bench-unfit-") as workdir:
            run(spark, bootstrap, 2_000, 0, Path(workdir))  # warm-up
            for round_ in range(args.runs):
                base = None
                for count in counts:
                    took, isolate = run(spark, bootstrap, args.records, count, Path(workdir))
                    base = took if count == 0 else base
                    assert base is not None
                    rounds[count].append((took, isolate, took / base))
                    print(f"round {round_ + 1}: {count} unfit: {took:.1f} s, isolate "
                          f"{isolate:.1f} s", file=sys.stderr, flush=True)
    finally:
        if broker is not None:
            broker.close()
        spark.stop()
    figures = {}
    print(f"{args.records:,} records in one batch, medians of {args.runs} rounds")
    print(f"{'unfit':>5}  {'run s':>7}  {'isolate s':>9}  {'run / no unfit':>14}")
    for count, values in rounds.items():
        took, isolate, ratio = (statistics.median(v[i] for v in values) for i in range(3))
        figures[str(count)] = {"run_s": round(took, 2), "isolate_s": round(isolate, 2),
                               "ratio": round(ratio, 2)}
        print(f"{count:>5}  {took:>7.1f}  {isolate:>9.1f}  {ratio:>14.2f}")
    if args.json:
        print(json.dumps({"records": args.records, "unfit": figures}))


if __name__ == "__main__":
    main()
