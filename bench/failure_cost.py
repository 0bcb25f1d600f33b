"""Where one failure's cost goes: this process's CPU and the broker's, per failed record.

    python bench/failure_cost.py [--broker noida-db|tansu] [--records N] [--rounds N]

bench/consumer.py reports what one failure costs as P2 counts it (throughput lost per failure,
trivial handler). This script runs the same loops (its `redrive_run`, trivial handler) without
failures and with 5 % failing once, alternately on one topic, and divides the difference in CPU
time, of this process (every thread: Python's and librdkafka's) and of the broker, by the number
of failures. Both loops share the machine's cores with the broker, so a failure's broker work
slows the consumer as well. The CPU of the thread that runs the consumer's loop is given apart:
redrive's own work, without librdkafka's threads and the broker. Every run starts once the broker
is idle and is measured from the consumer's start to its last record handled. With --json the
last line is one JSON object of the medians.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics

import consumer as bench  # bench/consumer.py: the loops, the topic filling and the handler work
from common import CpuMeter, settle
from redrive.dev.brokers import DevBroker

FAIL_RATE = 0.05


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def broker_cpu_s(meter: CpuMeter) -> float:
    _, broker = meter.read()
    assert broker is not None
    return broker


def measured(bootstrap: str, meter: CpuMeter, topic: str, records: int,
             fail_rate: float) -> tuple[float, float, float, float]:
    """Main-topic records/s, this process's CPU s, the broker's CPU s and the consumer thread's
    CPU s of one run, from the consumer's start to its last record handled.

    Each run starts on an idle broker: noida-db rewrites all it holds after the previous run's
    commits and topic deletions, which would otherwise be charged to this run. The stop, the
    consumer's close and the deletion of its topics are left out of the window too."""
    settle(meter)
    client, broker = process_cpu_s(), broker_cpu_s(meter)
    ends: list[tuple[float, float]] = []
    run = bench.redrive_run(bootstrap, topic, records, bench.work, fail_rate,
                            on_finished=lambda: ends.append((process_cpu_s(),
                                                             broker_cpu_s(meter))))
    return run.rate, ends[0][0] - client, ends[0][1] - broker, run.consumer_cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("noida-db", "tansu"), default="noida-db")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    failures = round(args.records * FAIL_RATE)
    broker = DevBroker(args.broker).start(timeout_s=60)
    try:
        assert broker.pid is not None
        meter = CpuMeter(broker.pid)
        topic = bench.fill(broker.bootstrap, args.records)
        rows: list[dict[str, float]] = []
        for _ in range(args.rounds):
            clean = measured(broker.bootstrap, meter, topic, args.records, 0.0)
            failing = measured(broker.bootstrap, meter, topic, args.records, FAIL_RATE)
            rows.append({
                "failure_us": bench.failure_cost_us(clean[0], failing[0], FAIL_RATE),
                "client_cpu_us": (failing[1] - clean[1]) / failures * 1e6,
                "broker_cpu_us": (failing[2] - clean[2]) / failures * 1e6,
                "thread_cpu_us": (failing[3] - clean[3]) / failures * 1e6,
            })
    finally:
        broker.stop()
    figures = {key: round(statistics.median(row[key] for row in rows), 1) for key in rows[0]}
    print(f"{args.broker}, {args.records:,} records, {FAIL_RATE:.0%} failing once, "
          f"{args.rounds} rounds (medians; per failure)")
    for key, label in (("failure_us", "cost of one failure as P2 counts it (us)"),
                       ("client_cpu_us", "this process's CPU per failure (us)"),
                       ("broker_cpu_us", "the broker's CPU per failure (us)"),
                       ("thread_cpu_us", "the consumer thread's CPU per failure (us)")):
        runs = " ".join(f"{row[key]:.0f}" for row in rows)
        print(f"{label:<44}{figures[key]:>8.1f}   runs {runs}")
    if args.json:
        print(json.dumps({"broker": args.broker, **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
