"""The Spark pipeline's driver SIGKILLed twice mid-stream and SIGTERMed once, each time started
again from its checkpoint; counted from the sink (Parquet) and the broker."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds

from chaoslib.count import EXACTLY_ONCE, Outcome, copy_key, read_topic, repeats, waiting
from chaoslib.faults import Sizes
from chaoslib.procs import Part, python
from chaoslib.runs import ConsumerRun

BATCHES_BEFORE = 2
BATCH_LINE = '{"batch"'


def sink_rows(sink: Path) -> Counter[int]:
    """Numbers in the sink's committed files (Spark's _temporary and _spark_metadata are
    passed over as pyarrow skips names starting with '_' or '.')."""
    if not sink.exists() or not any(sink.rglob("*.parquet")):
        return Counter()
    table = ds.dataset(str(sink), format="parquet", partitioning="hive").to_table(
        columns=["number"])
    return Counter(int(n) for n in table.column("number").to_pylist())


def stop_when_running(driver: Part) -> None:
    """SIGTERM once the pipeline runs: a driver signalled while its JVM starts, before the
    pipeline handles the signal, just dies (and has nothing to lose)."""
    driver.wait_ready(timeout_s=180)
    time.sleep(1.0)
    driver.terminate(grace_s=120)


def spark_driver(bootstrap: str, scratch: Path, sizes: Sizes) -> Outcome:
    fault = "Spark driver SIGKILL x2, SIGTERM x1"
    records = sizes.records(2_000, 600)
    run = ConsumerRun(bootstrap, scratch, "spark", records, partitions=3)
    sink, checkpoint = scratch / "spark-sink", scratch / "spark-checkpoint"
    arguments = {"bootstrap": bootstrap, "topic": run.topic, "group": run.group,
                 "sink": str(sink), "checkpoint": str(checkpoint),
                 "per_trigger": records // 6}
    driver = run.add(Part("Spark driver", python("-m", "chaoslib.spark_driver",
                                                 json.dumps(arguments)),
                          scratch / "spark-driver.out", group_kill=True,
                          ready_text="running"))

    def batches() -> int:
        return driver.log_text().count(BATCH_LINE)

    def dead() -> Counter[int]:
        return run.dead()

    try:
        for how in ("kill", "kill", "term"):
            before = batches()
            driver.start()
            deadline = time.monotonic() + 180
            while batches() < before + BATCHES_BEFORE and time.monotonic() < deadline:
                driver.check()
                if driver.process is None:
                    break
                time.sleep(0.2)
            if how == "kill":
                driver.kill()
            else:
                stop_when_running(driver)
        driver.start()
        deadline = time.monotonic() + sizes.finish_s + 60
        expected = set(run.expected)
        done = False
        while time.monotonic() < deadline and driver.alive:
            finished = set(sink_rows(sink)) | set(dead())
            if expected <= finished:
                done = True
                break
            time.sleep(2)
        stop_when_running(driver)
        outcome = run.outcome(fault, EXACTLY_ONCE)
        if not done:
            outcome.notes.append(f"not finished; the driver's log ends:\n"
                                 f"{driver.log_text()[-1500:]}")
        copies = read_topic(bootstrap, f"{run.topic}.{run.group}.retry.1s")
        in_flight = {r.number for r in waiting(bootstrap, run.group,
                                               [run.topic, f"{run.topic}.{run.group}.retry.1s"])}
        return outcome.tally(run.expected, sink_rows(sink), dead(), in_flight=in_flight,
                             copies_twice=repeats(Counter(copy_key(c) for c in copies)))
    finally:
        run.abandon()
