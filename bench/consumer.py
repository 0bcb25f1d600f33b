"""Benchmark of RetryingConsumer against a raw confluent-kafka loop on the same records.

    python bench/consumer.py [--quick] [--bootstrap HOST:PORT] [--json] [--handler-us N]

Starts its own noida-db unless --bootstrap is given. Every figure is the median of several rounds,
each round running each loop once, reading the same topic from the start in a fresh group; a ratio
is the median of the rounds' ratios, so that a loop is compared with the one run beside it rather
than with runs the machine's other load made faster or slower. Throughput is counted from the
first record handled to the last main-topic record handled, so group joins are left out.

P1  RetryingConsumer with no failures / raw consume + per-batch synchronous commit loop doing the
    same work (goal >= 0.90). Both use RetryingConsumer's client settings, so that the ratio
    measures redrive's own work and not a difference in fetch tuning.
P2  main-topic records/s with --fail-rate of records failing once / with none (goal >= 0.85),
    beside the same ratio for a blocking consumer that sleeps the backoff and retries in place
    (what users have without redrive; measured on a prefix of the records, as it is slow).
    Also what one failure costs. With --handler-us N every handler call (the same in every loop)
    spends N us more of CPU, as a handler that parses or enriches its record would: how P2 fares
    when the handler's own work is not trivial beside a failure's cost.
P3  lateness past due of the retried records, p50 and p99 (goal p99 <= 250 ms), measured while
    records are written at a steady rate the consumer keeps up with; beside it the lateness of P2's
    retries, which wait behind a backlog read flat out; and how many records of all runs were
    handled before their due time (must be 0).
With --json the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.consumer.runtime import CONSUMER_OVERRIDES
from redrive.devbroker import DevBroker
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

PARTITIONS = 4
VALUE_BYTES = 100
BACKOFF_MS = 100
PACED_RATE = 5_000
BATCH = 500
QUIET_LOG = logging.getLogger("bench.consumer.client")
QUIET_LOG.addHandler(logging.NullHandler())


def failing(records: int, rate: float) -> bytes:
    """Which records fail their first delivery (1) or not (0): a fixed, evenly spread set.

    Looked up the same way in runs with and without failures, so that choosing which records fail
    costs a run with failures nothing more than one without.
    """
    return bytes((index * 2654435761) % 10_000 < rate * 10_000 for index in range(records))


Work = Callable[[bytes | None], int]


def work(value: bytes | None) -> int:
    return len(value or b"")


def make_work(handler_us: float) -> Work:
    """The handler's own work on a record, the same in every loop: `work`, and with --handler-us
    that much CPU time besides (what parsing or enriching a record would cost)."""
    if not handler_us:
        return work
    busy_s = handler_us / 1e6

    def busy_work(value: bytes | None) -> int:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        return len(value or b"")

    return busy_work


def fill(bootstrap: str, records: int) -> str:
    topic = f"bench-consumer-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: PARTITIONS})
    producer = kafka.producer(bootstrap, overrides={"linger.ms": 20, "batch.size": 1_000_000})
    for start in range(0, records, 10_000):
        kafka.produce_confirmed(producer, [
            kafka.OutRecord(topic, f"{i:08d}".encode().ljust(VALUE_BYTES, b"."),
                            partition=i % PARTITIONS)
            for i in range(start, min(records, start + 10_000))])
    return topic


@dataclass
class Clock:
    """First and last main-topic handling times of one run."""

    first: float = 0.0
    last: float = 0.0
    main_done: int = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if not self.first:
            self.first = now
        self.last = now
        self.main_done += 1

    def rate(self) -> float:
        return self.main_done / max(self.last - self.first, 1e-9)


def raw_run(bootstrap: str, topic: str, records: int, work: Work,
            fail_rate: float = 0.0) -> float:
    """The baseline loop; with fail_rate, failures sleep the backoff and retry in place."""
    fail = failing(records, fail_rate)
    consumer = kafka.consumer(bootstrap, f"bench-raw-{uuid.uuid4().hex[:8]}",
                              {**CONSUMER_OVERRIDES, "logger": QUIET_LOG})
    consumer.subscribe([topic])
    clock = Clock()
    try:
        while clock.main_done < records:
            offsets: dict[tuple[str, int], int] = {}
            for message in consumer.consume(BATCH, 0.1):
                if message.error() is not None:
                    continue
                value = message.value()
                index = int((value or b"0")[:8])
                if index >= records:
                    continue
                if fail[index]:
                    work(value)  # the failed first try, retried in place after the backoff
                    time.sleep(BACKOFF_MS / 1000)
                work(value)
                clock.tick()
                offsets[(str(message.topic()), int(message.partition() or 0))] = \
                    int(message.offset() or 0) + 1
            if offsets:
                consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                asynchronous=False)
    finally:
        consumer.close()
    return clock.rate()


@dataclass
class RedriveRun:
    rate: float
    lateness_ms: list[float] = field(default_factory=list)
    early: int = 0


def redrive_run(bootstrap: str, topic: str, records: int, work: Work,
                fail_rate: float) -> RedriveRun:
    clock = Clock()
    lateness: list[float] = []
    fail = failing(records, fail_rate)
    expected_retries = sum(fail)

    # A main-topic record gets exactly the raw loop's work; the end of the run is watched from
    # outside, so that the handler carries nothing the raw loop does not.
    def handler(record: Record) -> None:
        value = record.value
        due = record.delivery.due_ms
        if due is not None:
            lateness.append(time.time_ns() / 1e6 - due)
            work(value)
            return
        index = int((value or b"0")[:8])
        work(value)
        clock.tick()
        if fail[index]:
            raise RuntimeError("transient")

    policy = RetryPolicy(backoff=Backoff.fixed(f"{BACKOFF_MS}ms"), attempts=2)
    consumer = RetryingConsumer(bootstrap, topic, f"bench-redrive-{uuid.uuid4().hex[:8]}",
                                policy, handler, batch_size=BATCH, config={"logger": QUIET_LOG})
    consumer.start()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    while not (finished := clock.main_done >= records and len(lateness) >= expected_retries):
        if time.monotonic() > deadline or not thread.is_alive():
            break
        time.sleep(0.005)
    consumer.stop()
    thread.join(60)
    if not finished:
        raise RuntimeError(f"run did not finish: {clock.main_done}/{records} main records, "
                           f"{len(lateness)}/{expected_retries} retries")
    return RedriveRun(clock.rate(), lateness, sum(1 for late in lateness if late < 0))


def paced_run(bootstrap: str, rate: int, seconds: float, work: Work,
              fail_rate: float) -> RedriveRun:
    """Lateness when the consumer keeps up: records are written at `rate` per second while it
    runs, instead of waiting as a backlog."""
    topic = f"bench-paced-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: PARTITIONS})
    total = int(rate * seconds)
    writer_done = threading.Event()

    def write() -> None:
        producer = kafka.producer(bootstrap, overrides={"logger": QUIET_LOG})
        step = max(1, rate // 100)  # a burst every 10 ms
        started = time.perf_counter()
        for first in range(0, total, step):
            kafka.produce_confirmed(producer, [
                kafka.OutRecord(topic, f"{i:08d}".encode().ljust(VALUE_BYTES, b"."),
                                partition=i % PARTITIONS)
                for i in range(first, min(total, first + step))])
            time.sleep(max(0.0, started + (first + step) / rate - time.perf_counter()))
        writer_done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    run = redrive_run(bootstrap, topic, total, work, fail_rate)
    writer.join(60)
    return run


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def failure_cost_us(clean_rate: float, failing_rate: float, fail_rate: float) -> float:
    """What one failure adds to a run with failures, as P2 counts it: a main-topic record takes
    1/clean_rate without failures and 1/failing_rate with them, the difference being the fail
    rate times the cost of a failure (its failed call, routing, its copy, and whatever of the
    retries' handling falls before the last main-topic record)."""
    return round((1 / failing_rate - 1 / clean_rate) / fail_rate * 1e6, 1)


def spread(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: start noida-db)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument("--fail-rate", type=float, default=0.05)
    parser.add_argument("--handler-us", type=float, default=0.0,
                        help="CPU time each handler call spends besides the trivial work")
    args = parser.parse_args()
    if not 0 < args.fail_rate < 1:
        parser.error(f"invalid --fail-rate={args.fail_rate!r}: must be between 0 and 1")
    if args.handler_us < 0:
        parser.error(f"invalid --handler-us={args.handler_us!r}: must not be negative")
    work = make_work(args.handler_us)
    records, runs, blocking_records = (300_000, 7, 600) if args.quick else (1_000_000, 9, 2_000)

    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60)
    bootstrap = args.bootstrap or (broker.bootstrap if broker else "")
    try:
        topic = fill(bootstrap, records)
        # A warm-up round, not counted: the first reads of a freshly written topic, the first
        # group joins and imports are slower for whichever loop comes first.
        raw_run(bootstrap, topic, records, work)
        redrive_run(bootstrap, topic, records, work, 0.0)
        raw: list[float] = []
        clean: list[float] = []
        failing: list[RedriveRun] = []
        blocking: list[float] = []
        for round_ in range(runs):
            # Every other round starts with redrive, so that neither loop always runs first.
            if round_ % 2:
                clean.append(redrive_run(bootstrap, topic, records, work, 0.0).rate)
                raw.append(raw_run(bootstrap, topic, records, work))
            else:
                raw.append(raw_run(bootstrap, topic, records, work))
                clean.append(redrive_run(bootstrap, topic, records, work, 0.0).rate)
            failing.append(redrive_run(bootstrap, topic, records, work, args.fail_rate))
        for _ in range(runs):
            blocking.append(raw_run(bootstrap, topic, blocking_records, work, args.fail_rate))
        paced = paced_run(bootstrap, PACED_RATE, 4.0 if args.quick else 10.0, work,
                          args.fail_rate)
    finally:
        if broker is not None:
            broker.close()

    raw_rate, clean_rate = statistics.median(raw), statistics.median(clean)
    p1_rounds = [c / r for c, r in zip(clean, raw, strict=True)]
    p2_rounds = [f.rate / c for f, c in zip(failing, clean, strict=True)]
    failing_rate = statistics.median(run.rate for run in failing)
    blocking_rate = statistics.median(blocking)
    lateness = paced.lateness_ms
    backlog_lateness = [late for run in failing for late in run.lateness_ms]
    figures = {
        "p1": round(statistics.median(p1_rounds), 3),
        "p2": round(statistics.median(p2_rounds), 3),
        "p2_blocking": round(blocking_rate / raw_rate, 3),
        "p3_p50_ms": round(percentile(lateness, 0.50), 1),
        "p3_p99_ms": round(percentile(lateness, 0.99), 1),
        "early": sum(run.early for run in failing) + paced.early,
        "p3_backlog_p50_ms": round(percentile(backlog_lateness, 0.50), 1),
        "p3_backlog_p99_ms": round(percentile(backlog_lateness, 0.99), 1),
        "p2_failure_us": failure_cost_us(clean_rate, failing_rate, args.fail_rate),
    }
    pct = f"{args.fail_rate:.0%}"
    rows = [
        ("P1 redrive / raw loop, no failures", f"{figures['p1']:.3f}", ">= 0.90",
         f"{clean_rate:,.0f} / {raw_rate:,.0f} rec/s; rounds {spread(p1_rounds)}"),
        (f"P2 redrive, {pct} failing / none", f"{figures['p2']:.3f}", ">= 0.85",
         f"{failing_rate:,.0f} / {clean_rate:,.0f} rec/s; rounds {spread(p2_rounds)}"),
        (f"P2 blocking in place, {pct} failing / none", f"{figures['p2_blocking']:.3f}", "",
         f"{blocking_rate:,.0f} / {raw_rate:,.0f} rec/s"),
        ("P2 cost of one failure (us)", f"{figures['p2_failure_us']:.1f}", "",
         "its failed call, routing, copy, and retry handling as P2 counts them"),
        ("P3 lateness past due p50 (ms), paced", f"{figures['p3_p50_ms']:.1f}", "",
         f"{len(lateness)} retries, {PACED_RATE:,} rec/s written while consuming"),
        ("P3 lateness past due p99 (ms), paced", f"{figures['p3_p99_ms']:.1f}", "<= 250", ""),
        ("P3 lateness p50 (ms), P2's backlog", f"{figures['p3_backlog_p50_ms']:.1f}", "",
         f"{len(backlog_lateness)} retries behind a backlog read flat out"),
        ("P3 lateness p99 (ms), P2's backlog", f"{figures['p3_backlog_p99_ms']:.1f}", "", ""),
        ("P3 handled before due", str(figures["early"]), "0", "all runs"),
    ]
    print(f"consumer benchmark: {records:,} records x {runs} runs (medians), {PARTITIONS} "
          f"partitions, backoff {BACKOFF_MS} ms, handler work +{args.handler_us:g} us, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"{'figure':<44} {'value':>8}  {'goal':<8}  detail")
    for name, value, goal, detail in rows:
        print(f"{name:<44} {value:>8}  {goal:<8}  {detail}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
