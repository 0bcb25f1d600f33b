"""A pipeline's driver SIGKILLed mid-stream and restarted from its checkpoint: nothing lost, no
row written twice to the sink, no retry or dead-letter copy made twice.

`make test` runs the DataFrame form, killed once: each driver started costs about 45 s on two
cores (its JVM, its session, and a first micro-batch that starts Python workers) before its first
batch. The per-record function form goes through the same fault in `make chaos` (bench/chaos.py's
spark-driver fault: two SIGKILLs and a SIGTERM, counted from its Parquet sink and the broker).
`FULL_CRASH_TEST=1` runs both forms here, each killed twice.

The driver runs in driver_runner.py's process (its JVM in the same process group, killed with
it, as when a driver's machine dies); the test itself starts no JVM (it reads the sink with
pyarrow), so it runs on the worker that does not hold the Spark session (tests/conftest.py).
The batches it finished are read from the pipeline's batch ledger, which is how the test knows
when every record has been handled.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pyarrow.dataset
import pytest

from redrive import kafka
from redrive.spark import ledger
from redrive.spark.outcomes import DEAD_LETTER, OK, RETRY, BatchReport

from ..records import produce_input
from .test_pipeline import read_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RUNNER = Path(__file__).with_name("driver_runner.py")
RECORDS = 400
FULL = bool(os.environ.get("FULL_CRASH_TEST"))
KILLS = 2 if FULL else 1
BATCHES_BEFORE_KILL = 1
FINISH_TIMEOUT_S = 240.0


def kind_of(i: int) -> str:
    return "bad" if i % 20 == 0 else "flaky" if i % 10 == 5 else "ok"


class Driver:
    def __init__(self, arguments: dict[str, str], log: Path) -> None:
        with log.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, str(RUNNER), json.dumps(arguments)], stdout=subprocess.PIPE,
                stderr=err, text=True, start_new_session=True)
        self.lines: IO[str] = self.process.stdout  # type: ignore[assignment]
        self.log = log

    def next_line(self, timeout_s: float) -> str:
        ready, _, _ = select.select([self.lines], [], [], timeout_s)
        line = self.lines.readline() if ready else ""
        if not line:
            raise AssertionError(f"driver: no line in {timeout_s}s (exit {self.process.poll()}); "
                                 f"{self.log.read_text(errors='replace')[-3000:]}")
        return line.strip()

    def wait_batches(self, n: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        for _ in range(n):
            self.next_line(max(1.0, deadline - time.monotonic()))

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.lines.close()

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        while self.next_line(120) != "stopped":
            pass
        assert self.process.wait(60) == 0
        self.lines.close()


def finished(bootstrap: str, group: str, checkpoint: str) -> tuple[Counter[str], Counter[int]]:
    """Records handled (by outcome) over the batches the ledger calls done, and how many times
    each batch was called done."""
    topic = ledger.ledger_topic(group)
    consumer = kafka.consumer(bootstrap)
    try:
        low, high = kafka.watermarks(consumer, topic, 0)
    finally:
        consumer.close()
    counts: Counter[str] = Counter()
    done: Counter[int] = Counter()
    for entry in ledger.read(bootstrap, topic, low, high):
        if entry.state != ledger.DONE or entry.report.get("checkpoint") != checkpoint:
            continue
        done[entry.batch] += 1
        report = BatchReport.from_dict(entry.report)
        counts["ok"] += sum(o.n for o in report.outcomes if o.status == OK)
        counts["dead"] += sum(r.n for r in report.routes if r.kind == DEAD_LETTER)
        counts["retried"] += sum(r.n for r in report.routes if r.kind == RETRY)
    return counts, done


FORMS = ["transform", "function"] if FULL else ["transform"]


@pytest.mark.parametrize("form", FORMS)
def test_a_killed_driver_loses_nothing_and_writes_nothing_twice(
        bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path, form: str) -> None:
    topic = new_topic(3)
    group = unique_name(f"crash-{form}")
    sent = {f"k{i}": kind_of(i) for i in range(RECORDS)}
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"{kind}:{key}".encode(), key.encode())
        for key, kind in sent.items()])
    expected = Counter(sent.values())
    sink, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    arguments = {"bootstrap": bootstrap, "topic": topic, "group": group, "form": form,
                 "sink": sink, "checkpoint": checkpoint}
    log = tmp_path / "driver.log"

    for _ in range(KILLS):
        driver = Driver(arguments, log)
        driver.wait_batches(BATCHES_BEFORE_KILL)
        driver.kill()
    driver = Driver(arguments, log)
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while True:
        counts, done = finished(bootstrap, group, checkpoint)
        if counts["ok"] >= expected["ok"] + expected["flaky"] and counts["dead"] >= expected["bad"]:
            break
        assert time.monotonic() < deadline, f"not finished in {FINISH_TIMEOUT_S}s: {counts}"
        time.sleep(1)
    driver.terminate()

    counts, done = finished(bootstrap, group, checkpoint)
    assert max(done.values()) == 1, "a batch was done twice"
    assert counts == {"ok": expected["ok"] + expected["flaky"], "dead": expected["bad"],
                      "retried": expected["flaky"]}
    # Read without Spark, as Spark reads a table: files under a directory whose name starts
    # with "_" or "." (a killed write's staging) are not the table's.
    rows = pyarrow.dataset.dataset(sink, format="parquet", partitioning="hive").to_table(
        columns=["key", "attempt"]).to_pylist()
    keys = Counter(row["key"] for row in rows)
    assert set(keys) == {k for k, kind in sent.items() if kind != "bad"}  # lost 0
    assert max(keys.values()) == 1  # 0 rows twice
    assert Counter(row["attempt"] for row in rows) == {0: expected["ok"], 1: expected["flaky"]}
    dead = Counter(m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.dlt"))
    assert dead == {k: 1 for k, kind in sent.items() if kind == "bad"}
    retried = Counter(m.key().decode() for m in read_all(bootstrap, f"{topic}.{group}.retry.1s"))
    assert retried == {k: 1 for k, kind in sent.items() if kind == "flaky"}
