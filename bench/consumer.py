"""Benchmark of RetryingConsumer against a raw confluent-kafka loop on the same records.

    python bench/consumer.py [--quick] [--bootstrap HOST:PORT] [--json] [--handler-us N]

Starts its own noida-db unless --bootstrap is given. Every figure is the median of several rounds,
each round running each loop once (P1's loops twice), reading the same topic from the start in a
fresh group; a ratio is the median of the rounds' ratios, so that a loop is compared with the one
run beside it rather than with runs the machine's other load made faster or slower. Throughput is
counted from the first record handled to the last main-topic record handled, so group joins are
left out. The two handlers' profiles run one after the other; each RetryingConsumer run's retry
and dead-letter topics, and each profile's topic once done with, are deleted (see delete_topics),
and each run of a round starts once the broker started here is idle.

Every loop runs with two handlers: a trivial one, which leaves redrive's own costs in plain view,
and one that spends --handler-us of CPU per call besides (default 20 us, about what decoding and
totalling a 1 KB JSON order would cost in CPython: a 470-byte one takes 9 us on this machine), as
a handler that does real work would.

P1  RetryingConsumer with no failures / raw consume + per-batch synchronous commit loop doing the
    same work, with the trivial handler (goal >= 0.90). Both use RetryingConsumer's client
    settings, so that the ratio measures redrive's own work and not a difference in fetch tuning.
P2  main-topic records/s with --fail-rate of records failing once / with none, with the working
    handler (goal >= 0.85), beside the same ratio for a blocking consumer that sleeps the backoff
    and retries in place (what users have without redrive; measured on a prefix of the records,
    as it is slow); beside it the same ratio timed until the last retry was handled, not the last
    main-topic record, which counts all the retries' handling but also the wait for the last ones
    to fall due. Also P2 with the trivial handler and what one failure costs: with a trivial
    handler a failure's copy, produced and consumed back, costs dozens of handler calls, so that
    P2 there measures the failure path alone. And P2 through the delay queue: the same failing
    run with retry_backend=DelayQueue, the delay service forwarding the retries back to the
    main topic (goal >= 0.85).
P3  lateness past due of the retried records, p50 and p99 (goal p99 <= 250 ms), measured while
    records are written at a steady rate the consumer keeps up with; beside it the lateness of P2's
    retries, which wait behind a backlog read flat out; and how many records of all runs were
    handled before their due time (must be 0). And the lateness behind a backlog with a slow
    handler (SLOW_HANDLER_MS of waiting a record, as a call to a service would): a retry is taken
    between poll batches, so it waits for the batch in hand.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from common import CpuMeter, percentile, settle
from redrive import kafka
from redrive.backends import DelayQueue, RetryBackend
from redrive.consumer import RetryingConsumer
from redrive.consumer.readers import CONSUMER_OVERRIDES
from redrive.delay import DelayService, Tiers
from redrive.dev.brokers import DevBroker
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

PARTITIONS = 4
VALUE_BYTES = 100
BACKOFF_MS = 100
PACED_RATE = 5_000
SLOW_HANDLER_MS = 5
BATCH = 500
QUIET_LOG = logging.getLogger("bench.consumer.client")
QUIET_LOG.addHandler(logging.NullHandler())
# noida-db ignores fetch.max.bytes and max.partition.fetch.bytes and answers a fetch with the whole
# backlog of the partitions asked for; above librdkafka's default receive limit (100 MB, about
# 900k of these records) every loop would stall on "Invalid response size". Given to every loop.
CLIENT_OVERRIDES: Mapping[str, Any] = {"logger": QUIET_LOG,
                                       "receive.message.max.bytes": 1_000_000_000}


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
    """The working handler's work on a record, the same in every loop: `work`, and handler_us of
    computation besides (what parsing or enriching a record would cost).

    The computation is a sum over a range sized here to take handler_us at the machine's best
    speed. Real work, like redrive's own, takes longer when the machine is busy; a wait on a
    clock would not (a wall-clock wait shrinks the handler's share under load, and polling the
    thread's CPU clock makes a system call every microsecond, which slows whatever runs next).
    """
    count = 1_000
    for _ in range(3):  # a sum's cost per number depends a little on its length: converge
        best_s = min(_timed_sum(count) for _ in range(200))
        count = max(1, round(count * handler_us / 1e6 / best_s))

    def busy_work(value: bytes | None) -> int:
        sum(range(count))
        return len(value or b"")

    return busy_work


def waiting_work(value: bytes | None) -> int:
    """A slow handler's work: a wait on a service, not CPU."""
    time.sleep(SLOW_HANDLER_MS / 1000)
    return len(value or b"")


def _timed_sum(count: int) -> float:
    started = time.perf_counter()
    sum(range(count))
    return time.perf_counter() - started


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
    """First and last main-topic handling times of one run, and when its last retry was handled."""

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

    def rate_with_retries(self, last_retry: float) -> float:
        return self.main_done / max(max(self.last, last_retry) - self.first, 1e-9)


def raw_run(bootstrap: str, topic: str, records: int, work: Work,
            fail_rate: float = 0.0) -> float:
    """The baseline loop; with fail_rate, failures sleep the backoff and retry in place."""
    fail = failing(records, fail_rate)
    consumer = kafka.consumer(bootstrap, f"bench-raw-{uuid.uuid4().hex[:8]}",
                              {**CONSUMER_OVERRIDES, **CLIENT_OVERRIDES})
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
    rate_with_retries: float
    lateness_ms: list[float] = field(default_factory=list)
    early: int = 0
    consumer_cpu_s: float = 0.0  # RetryingConsumer.run's thread's, to the last record handled


def redrive_run(bootstrap: str, topic: str, records: int, work: Work,
                fail_rate: float, retry_backend: RetryBackend | None = None,
                on_finished: Callable[[], None] | None = None) -> RedriveRun:
    """One RetryingConsumer run; `on_finished` is called once its last record is handled, before
    the consumer stops and its topics are deleted, so that a caller can end its measurement
    there and leave the teardown out."""
    clock = Clock()
    lateness: list[float] = []
    last_retry = [0.0]
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
            last_retry[0] = time.perf_counter()
            return
        index = int((value or b"0")[:8])
        work(value)
        clock.tick()
        if fail[index]:
            raise RuntimeError("transient")

    policy = RetryPolicy(backoff=Backoff.fixed(f"{BACKOFF_MS}ms"), attempts=2)
    consumer = RetryingConsumer(bootstrap, topic, f"bench-redrive-{uuid.uuid4().hex[:8]}",
                                policy, handler, batch_size=BATCH, config=dict(CLIENT_OVERRIDES),
                                retry_backend=retry_backend)
    consumer.start()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    consumer_cpu = 0.0
    while not (finished := clock.main_done >= records and len(lateness) >= expected_retries):
        if time.monotonic() > deadline or not thread.is_alive():
            break
        time.sleep(0.005)
    if finished:
        # The thread's own CPU clock, read while it still runs: its shutdown is left out.
        assert thread.ident is not None
        consumer_cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        if on_finished is not None:
            on_finished()
    consumer.stop()
    thread.join(60)
    delete_topics(bootstrap, [name for plan in consumer.plans.values()
                              for name in plan.created_topics])
    if not finished:
        raise RuntimeError(f"run did not finish: {clock.main_done}/{records} main records, "
                           f"{len(lateness)}/{expected_retries} retries")
    return RedriveRun(clock.rate(), clock.rate_with_retries(last_retry[0]), lateness,
                      sum(1 for late in lateness if late < 0), consumer_cpu)


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete what a finished run or profile made: noida-db rewrites all it holds after every
    write (a committed offset included), at a cost in proportion to it, so that whatever the
    bench kept would slow every later run. Each RetryingConsumer run's group has retry and
    dead-letter topics of its own (with DelayQueue, only the latter were made)."""
    admin = kafka.admin(bootstrap)
    existing = kafka.topic_partitions(admin)
    kafka.delete_topics(admin, [name for name in names if name in existing])


def delay_queue_run(bootstrap: str, topic: str, records: int, work: Work,
                    fail_rate: float) -> RedriveRun:
    """A failing run whose retries wait in the delay service's tiers (DelayQueue) instead of the
    group's retry topics. The service runs only for this run, on tiers of its own: idle, it
    would take CPU from the other runs (see docs/benchmarks.md on noida-db's empty fetches)."""
    tiers = Tiers.of((f"{BACKOFF_MS}ms",), prefix=f"bench-delay-{uuid.uuid4().hex[:8]}")
    service = DelayService(bootstrap, tiers, partitions=PARTITIONS,
                           group_id=f"bench-delay-{uuid.uuid4().hex[:8]}",
                           consumer_overrides=CLIENT_OVERRIDES)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not service.metrics.value("redrive_rebalances_total", kind="assign"):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the delay service did not start")
        time.sleep(0.05)
    try:
        return redrive_run(bootstrap, topic, records, work, fail_rate, DelayQueue(tiers))
    finally:
        service.stop()
        thread.join(60)
        delete_topics(bootstrap, tiers.owned_topics)


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


def failure_cost_us(clean_rate: float, failing_rate: float, fail_rate: float) -> float:
    """What one failure adds to a run with failures, as P2 counts it: a main-topic record takes
    1/clean_rate without failures and 1/failing_rate with them, the difference being the fail
    rate times the cost of a failure (its failed call, routing, its copy, and whatever of the
    retries' handling falls before the last main-topic record)."""
    return round((1 / failing_rate - 1 / clean_rate) / fail_rate * 1e6, 1)


def spread(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


@dataclass
class Profile:
    """One handler's runs: each round runs `pairs` pairs of the raw loop and RetryingConsumer
    without failures, then RetryingConsumer with them, on a topic of its own."""

    work: Work
    records: int
    pairs: int = 1
    topic: str = ""
    raw: list[float] = field(default_factory=list)
    clean: list[float] = field(default_factory=list)
    failing: list[RedriveRun] = field(default_factory=list)
    delay_queue: bool = False  # also a failing run through DelayQueue each round
    failing_dq: list[RedriveRun] = field(default_factory=list)

    def fill(self, bootstrap: str) -> None:
        self.topic = fill(bootstrap, self.records)
        # A warm-up round, not counted: the first reads of a freshly written topic, the first
        # group joins and imports are slower for whichever loop comes first.
        raw_run(bootstrap, self.topic, self.records, self.work)
        redrive_run(bootstrap, self.topic, self.records, self.work, 0.0)

    def round(self, bootstrap: str, fail_rate: float, redrive_first: bool,
              meter: CpuMeter) -> None:
        """Every run starts once the broker is idle: noida-db rewrites all it holds after the
        previous run's commits and deleted topics, which would otherwise slow this run."""
        def raw() -> None:
            settle(meter)
            self.raw.append(raw_run(bootstrap, self.topic, self.records, self.work))

        def clean() -> None:
            settle(meter)
            self.clean.append(
                redrive_run(bootstrap, self.topic, self.records, self.work, 0.0).rate)

        for pair in range(self.pairs):
            # Pairs alternate which loop runs first too: the first of two runs is often faster.
            first_redrive = redrive_first != bool(pair % 2)
            for run in (clean, raw) if first_redrive else (raw, clean):
                run()
        settle(meter)
        self.failing.append(
            redrive_run(bootstrap, self.topic, self.records, self.work, fail_rate))
        if self.delay_queue:
            settle(meter)
            self.failing_dq.append(
                delay_queue_run(bootstrap, self.topic, self.records, self.work, fail_rate))

    @property
    def p1_rounds(self) -> list[float]:
        """One ratio per pair of runs."""
        return [c / r for c, r in zip(self.clean, self.raw, strict=True)]

    @property
    def clean_before_failing(self) -> list[float]:
        """Each round's last run without failures, the one beside its run with them."""
        return self.clean[self.pairs - 1::self.pairs]

    @property
    def p2_rounds(self) -> list[float]:
        return [f.rate / c
                for f, c in zip(self.failing, self.clean_before_failing, strict=True)]

    @property
    def p2_delay_queue_rounds(self) -> list[float]:
        return [f.rate / c
                for f, c in zip(self.failing_dq, self.clean_before_failing, strict=True)]

    @property
    def p2_with_retries_rounds(self) -> list[float]:
        return [f.rate_with_retries / c
                for f, c in zip(self.failing, self.clean_before_failing, strict=True)]

    def failure_us_rounds(self, fail_rate: float) -> list[float]:
        return [failure_cost_us(c, f.rate, fail_rate)
                for f, c in zip(self.failing, self.clean_before_failing, strict=True)]

    # The medians of the rates that the ratios pair up, shown beside the ratios: a ratio is the
    # median of the rounds' ratios, which these medians' quotient need not equal.
    @property
    def raw_rate(self) -> float:
        return statistics.median(self.raw)

    @property
    def clean_rate(self) -> float:
        """Every run without failures: P1's pairs."""
        return statistics.median(self.clean)

    @property
    def clean_beside_failing_rate(self) -> float:
        """The runs without failures that P2's ratios are taken against."""
        return statistics.median(self.clean_before_failing)

    @property
    def failing_rate(self) -> float:
        return statistics.median(run.rate for run in self.failing)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: start noida-db)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    parser.add_argument("--fail-rate", type=float, default=0.05)
    parser.add_argument("--handler-us", type=float, default=20.0,
                        help="CPU time each call of the working handler spends (P2's handler)")
    args = parser.parse_args()
    if not 0 < args.fail_rate < 1:
        parser.error(f"invalid --fail-rate={args.fail_rate!r}: must be between 0 and 1")
    if args.handler_us <= 0:
        parser.error(f"invalid --handler-us={args.handler_us!r}: must be positive")
    records, runs, blocking_runs, blocking_records, slow_records = \
        (300_000, 5, 3, 400, 1_000) if args.quick else (1_000_000, 9, 9, 2_000, 3_000)
    # The working handler's topic is sized so that its runs take a few times as long as trivial
    # ones (a trivial record costs about 1 us), enough for their rates to settle.
    working_records = max(10_000, min(records, int(records * 3 / (1 + args.handler_us))))
    # P1's runs are short and the machine's speed drifts from one second to the next: its
    # median is taken over twice as many pairs as the other figures' rounds.
    trivial = Profile(work, records, pairs=2)
    working = Profile(make_work(args.handler_us), working_records, delay_queue=True)

    broker = None if args.bootstrap else DevBroker("noida-db").start(timeout_s=60)
    bootstrap = args.bootstrap or (broker.bootstrap if broker else "")
    meter = CpuMeter(broker.pid if broker else None)
    try:
        # One profile after the other, each topic deleted once done with (see delete_topics).
        for profile in (trivial, working):
            profile.fill(bootstrap)
            for round_ in range(runs):
                # Every other round starts with redrive, so that neither loop always runs first.
                profile.round(bootstrap, args.fail_rate, redrive_first=bool(round_ % 2),
                              meter=meter)
            if profile is trivial:
                delete_topics(bootstrap, [profile.topic])
        blocking = [raw_run(bootstrap, working.topic, blocking_records, working.work,
                            args.fail_rate) for _ in range(blocking_runs)]
        delete_topics(bootstrap, [working.topic])
        paced = paced_run(bootstrap, PACED_RATE, 4.0 if args.quick else 10.0, working.work,
                          args.fail_rate)
        slow_topic = fill(bootstrap, slow_records)
        slow = redrive_run(bootstrap, slow_topic, slow_records, waiting_work, args.fail_rate)
        delete_topics(bootstrap, [slow_topic])
    finally:
        if broker is not None:
            broker.close()

    blocking_rate = statistics.median(blocking)
    lateness = paced.lateness_ms
    backlog_lateness = [late for run in working.failing for late in run.lateness_ms]
    figures = {
        "p1": round(statistics.median(trivial.p1_rounds), 3),
        "p2": round(statistics.median(working.p2_rounds), 3),
        "p2_blocking": round(blocking_rate / working.raw_rate, 3),
        "p2_with_retries": round(statistics.median(working.p2_with_retries_rounds), 3),
        "p3_p50_ms": round(percentile(lateness, 0.50), 1),
        "p3_p99_ms": round(percentile(lateness, 0.99), 1),
        "p3_samples": len(lateness),
        "early": sum(run.early for p in (trivial, working)
                     for run in [*p.failing, *p.failing_dq]) + paced.early + slow.early,
        "handler_us": args.handler_us,
        "p1_working": round(statistics.median(working.p1_rounds), 3),
        "p2_trivial": round(statistics.median(trivial.p2_rounds), 3),
        "p2_failure_us": round(statistics.median(trivial.failure_us_rounds(args.fail_rate)), 1),
        "p2_failure_us_runs": trivial.failure_us_rounds(args.fail_rate),
        "p1_redrive_per_s": round(trivial.clean_rate), "p1_raw_per_s": round(trivial.raw_rate),
        "p3_backlog_p50_ms": round(percentile(backlog_lateness, 0.50), 1),
        "p3_backlog_p99_ms": round(percentile(backlog_lateness, 0.99), 1),
        "p3_backlog_samples": len(backlog_lateness),
        "p2_delayqueue": round(statistics.median(working.p2_delay_queue_rounds), 3),
        "p3_slow_backlog_p50_ms": round(percentile(slow.lateness_ms, 0.50), 1),
        "p3_slow_backlog_p99_ms": round(percentile(slow.lateness_ms, 0.99), 1),
        # A p99 of about 150 retries is their second-highest value: say how few there were.
        "p3_slow_backlog_samples": len(slow.lateness_ms),
    }
    pct = f"{args.fail_rate:.0%}"
    us = f"{args.handler_us:g} us"
    paired = "medians of the paired rates"
    rows = [
        ("P1 redrive / raw loop, no failures, trivial", f"{figures['p1']:.3f}", ">= 0.90",
         f"{paired} {trivial.clean_rate:,.0f} / {trivial.raw_rate:,.0f} rec/s; "
         f"{len(trivial.p1_rounds)} pairs {spread(trivial.p1_rounds)}"),
        (f"P1 the same, handler {us}", f"{figures['p1_working']:.3f}", "",
         f"{paired} {working.clean_rate:,.0f} / {working.raw_rate:,.0f} rec/s; "
         f"rounds {spread(working.p1_rounds)}"),
        (f"P2 redrive, {pct} failing / none, {us}", f"{figures['p2']:.3f}", ">= 0.85",
         f"{paired} {working.failing_rate:,.0f} / {working.clean_beside_failing_rate:,.0f} "
         f"rec/s; rounds {spread(working.p2_rounds)}"),
        ("P2 the same, until the last retry handled", f"{figures['p2_with_retries']:.3f}", "",
         f"rounds {spread(working.p2_with_retries_rounds)}; includes waiting out the last "
         f"retries' {BACKOFF_MS} ms backoff"),
        (f"P2 through DelayQueue, {pct} failing / none", f"{figures['p2_delayqueue']:.3f}",
         ">= 0.85", f"{paired} {statistics.median(r.rate for r in working.failing_dq):,.0f} / "
         f"{working.clean_beside_failing_rate:,.0f} rec/s; "
         f"rounds {spread(working.p2_delay_queue_rounds)}"),
        (f"P2 blocking in place, {us}", f"{figures['p2_blocking']:.3f}", "",
         f"quotient of the medians {blocking_rate:,.0f} / {working.raw_rate:,.0f} rec/s "
         "(runs not paired)"),
        ("P2 redrive, trivial handler", f"{figures['p2_trivial']:.3f}", "",
         f"{paired} {trivial.failing_rate:,.0f} / {trivial.clean_beside_failing_rate:,.0f} "
         f"rec/s; rounds {spread(trivial.p2_rounds)}"),
        ("P2 cost of one failure (us), trivial", f"{figures['p2_failure_us']:.1f}", "",
         f"median of the rounds' ({min(figures['p2_failure_us_runs']):.0f} to "
         f"{max(figures['p2_failure_us_runs']):.0f}): its failed call, "
         "routing, copy, and retry handling as P2 counts them"),
        ("P3 lateness past due p50 (ms), paced", f"{figures['p3_p50_ms']:.1f}", "",
         f"{len(lateness)} retries, {PACED_RATE:,} rec/s written while consuming"),
        ("P3 lateness past due p99 (ms), paced", f"{figures['p3_p99_ms']:.1f}", "<= 250", ""),
        ("P3 lateness p50 (ms), P2's backlog", f"{figures['p3_backlog_p50_ms']:.1f}", "",
         f"{len(backlog_lateness)} retries behind a backlog read flat out"),
        ("P3 lateness p99 (ms), P2's backlog", f"{figures['p3_backlog_p99_ms']:.1f}", "", ""),
        (f"P3 lateness p50 (ms), backlog, {SLOW_HANDLER_MS} ms handler",
         f"{figures['p3_slow_backlog_p50_ms']:.1f}", "",
         f"{len(slow.lateness_ms)} retries behind {slow_records:,} records"),
        (f"P3 lateness p99 (ms), backlog, {SLOW_HANDLER_MS} ms handler",
         f"{figures['p3_slow_backlog_p99_ms']:.1f}", "",
         f"nearest rank of {len(slow.lateness_ms)} samples"),
        ("P3 handled before due", str(figures["early"]), "0", "all runs"),
    ]
    print(f"consumer benchmark: {records:,} records (working handler: {working_records:,}) x "
          f"{runs} runs (medians), {PARTITIONS} partitions, backoff {BACKOFF_MS} ms, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"{'figure':<44} {'value':>8}  {'goal':<8}  detail")
    for name, value, goal, detail in rows:
        print(f"{name:<44} {value:>8}  {goal:<8}  {detail}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
