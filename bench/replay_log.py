"""What a replay pays to read the replay log, which keeps an entry for every record ever
replayed (compaction keeps one per record, not fewer):

    python bench/replay_log.py [--entries 200000] [--runs 3] [--json]

Fills `redrive.replays` on its own noida-db with --entries entries of one dead-letter topic (as
`_entry` writes them), waits for the broker to go idle, then times, in alternating rounds:
  raw       reading the whole log with read_topic, decoding nothing (the floor);
  selected  read_log for one record's key, as a replay of one record reads it;
  all       read_log decoding every entry of the topic (a replay before 2026-11-29 did).
It prints each as seconds and as a ratio to the raw read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from confluent_kafka import Producer

from common import CpuMeter, settle
from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.kafka.ranges import read_topic
from redrive.ops import replay as log

DLT = "orders.billing.dlt"


def fill(bootstrap: str, entries: int) -> None:
    kafka.create_topics(kafka.admin(bootstrap), {log.REPLAY_LOG: 1}, config=log.LOG_CONFIG)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for i in range(entries):
        entry = {"replay_id": "abc123def456", "who": "oncall@host", "when_ms": 1795950000000,
                 "when": "2026-11-29T12:00:00.000+00:00",
                 "source": {"topic": DLT, "partition": i % 4, "offset": i,
                            "timestamp_ms": 1795950000000},
                 "destination": {"topic": "orders", "partition": i % 4, "offset": i},
                 "to": "original", "attempts": "reset", "reason": "exhausted",
                 "error_type": "ValueError", "system": "redrive"}
        producer.produce(log.REPLAY_LOG, json.dumps(entry, sort_keys=True).encode(),
                         log.log_key(DLT, i % 4, i).encode())
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()


def timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    broker = DevBroker("noida-db").start(timeout_s=60)
    try:
        bootstrap = broker.bootstrap
        fill(bootstrap, args.entries)
        meter = CpuMeter(broker.pid)
        settle(meter)
        one = {log.log_key(DLT, 1, 1)}
        steps = {
            "raw": lambda: sum(1 for _ in read_topic(bootstrap, log.REPLAY_LOG, 1, idle_s=30,
                                                     whole=True)),
            "selected": lambda: log.read_log(bootstrap, DLT, keys=one),
            "all": lambda: log.read_log(bootstrap, DLT),
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        for run in range(args.runs):
            order = list(steps) if run % 2 == 0 else list(reversed(steps))
            for name in order:
                times[name].append(timed(steps[name]))
    finally:
        broker.stop()
    medians = {name: statistics.median(values) for name, values in times.items()}
    figures = {"entries": args.entries, **{f"{name}_s": round(value, 3)
                                           for name, value in medians.items()},
               "selected_vs_raw": round(medians["selected"] / medians["raw"], 2),
               "all_vs_raw": round(medians["all"] / medians["raw"], 2)}
    if args.json:
        print(json.dumps(figures))
    else:
        for name in steps:
            print(f"{name:9} {medians[name]:7.2f} s   {medians[name] / medians['raw']:5.2f} x raw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
