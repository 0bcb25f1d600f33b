"""Benchmark of the delay service (`python -m redrive delay run`, one process).

    python bench/delay.py [--quick] [--bootstrap HOST:PORT] [--json]

Starts its own noida-db (and Tansu for D3) unless --bootstrap is given. Tiers are 100ms, 1s, 10s
and 1h, so the documented lateness bound is 100 ms (the smallest tier) plus the service's latency.

D1  forwarded records/s of the service (transactional, and at-least-once) / a raw loop with the
    service's client settings that consumes the same tier topic and produces each record to a
    topic, one transaction per poll (at-least-once, as the service: acknowledged produce, then an
    asynchronous commit per poll and a synchronous one at the end); each runs in a process of its
    own. Rates run from the first batch's forwarding instant to the last one's, so group joins are
    left out. Each of 3 rounds runs the service and the raw loop once, alternating which goes
    first; the ratio is the median of the rounds' ratios, the rates beside it the medians of the
    rounds' rates.
D2  lateness past the due time at 2,000 scheduled records/s with delays of 0.1 to 3 s, from each
    target record's timestamp (the service stamps the forwarding instant), p50 and p99
    (goal p99 <= bound + 250 ms), and how many were forwarded before their due time (must be 0).
D3  peak RSS (VmHWM) of the service once it has paused every partition in front of 10k, and of a
    fresh instance in front of 1M pending records (goal: within 50 MB of each other). Measured on
    Tansu when the bench starts its own brokers: noida-db ignores fetch size limits.
With --json the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from common import CpuMeter, percentile, settle
from redrive import kafka
from redrive.cli.formatting import table
from redrive.clock import now_ms
from redrive.delay import Tiers, ensure_topics, schedule
from redrive.delay.service import CONSUMER_SETTINGS, PRODUCER_SETTINGS
from redrive.dev.brokers import DevBroker
from redrive.dev.ports import free_port

TIERS = ("100ms", "1s", "10s", "1h")
PARTITIONS = 6
VALUE_BYTES = 100
RATE_PER_S = 2_000
# Tansu takes session.timeout.ms / 2 to form a group (brokers.md).
TANSU_GROUP = ("session.timeout.ms=2000", "heartbeat.interval.ms=200")
QUIET_LOG = logging.getLogger("bench.delay.client")
QUIET_LOG.addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Size:
    forward_records: int
    lateness_s: float
    pending_small: int
    pending_large: int


QUICK = Size(forward_records=50_000, lateness_s=8.0, pending_small=10_000, pending_large=200_000)
FULL = Size(forward_records=100_000, lateness_s=30.0, pending_small=10_000,
            pending_large=1_000_000)


def quiet(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": QUIET_LOG}



def payload(index: int) -> bytes:
    return f"{index:010d}".encode().ljust(VALUE_BYTES, b".")


def new_tiers() -> Tiers:
    return Tiers.of(TIERS, prefix=f"bench-{uuid.uuid4().hex[:8]}.delay")


def new_topic(bootstrap: str, name: str) -> str:
    topic = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(quiet(bootstrap)), {topic: PARTITIONS})
    return topic


def fast_producer(bootstrap: str) -> Producer:
    producer = kafka.producer(quiet(bootstrap), overrides={"linger.ms": 20})
    # The first flush of a new producer pays for its start-up; not the records' fault.
    producer.list_topics(timeout=10)
    return producer


class Service:
    """One delay-service process, as users run it."""

    def __init__(self, bootstrap: str, tiers: Tiers, *, at_least_once: bool = False,
                 consumer_config: Sequence[str] = ()) -> None:
        self.metrics_port = free_port()
        command = [sys.executable, "-m", "redrive", "delay", "run", "--bootstrap", bootstrap,
                   "--tiers", ",".join(TIERS), "--prefix", tiers.prefix,
                   "--group", f"bench-{uuid.uuid4().hex[:8]}", "--partitions", str(PARTITIONS),
                   "--instance-id", uuid.uuid4().hex[:8],
                   "--metrics-port", str(self.metrics_port)]
        if at_least_once:
            command.append("--at-least-once")
        for setting in consumer_config:
            command += ["--consumer-config", setting]
        self.log = Path(f"/tmp/bench-delay-{uuid.uuid4().hex[:8]}.log")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=1) as response:
                text = response.read().decode()
        except OSError:
            return 0.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(row for row in status.splitlines() if row.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.unlink(missing_ok=True)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"the delay service exited:\n{self.log.read_text()[-3000:]}")

    def wait_for(self, metric: str, at_least: float, timeout_s: float, what: str) -> None:
        """Wait until the service reports `metric` >= `at_least`; exit naming `what` if not."""
        deadline = time.monotonic() + timeout_s
        while self.metric(metric) < at_least:
            self.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"the service {what} in {timeout_s:.0f} s")
            time.sleep(0.2)


def read_timestamps(bootstrap: str, topic: str, expect: int,
                    timeout_s: float) -> list[tuple[int, int]]:
    """(timestamp, due) of each committed record of `topic`, once `expect` of them arrived."""
    consumer: Consumer = kafka.consumer(quiet(bootstrap))
    partitions = kafka.partition_count(kafka.admin(quiet(bootstrap)), topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for message in consumer.consume(5_000, 0.2):
                if message.error() is None:
                    headers = dict(kafka.message_headers(message))
                    out.append((int(message.timestamp()[1]),
                                int(headers.get("redrive-due", b"-1"))))
    finally:
        consumer.close()
    if len(out) < expect:
        raise SystemExit(f"{topic}: {len(out)} of {expect} records arrived in {timeout_s}s")
    return out


def rate_of(stamps: Sequence[tuple[int, int]]) -> float:
    """Records/s between the first batch's and the last batch's forwarding instant.

    Every record of a batch carries the instant its batch was forwarded, so the first batch's
    records are left out: they were handled before the first instant.
    """
    times = [stamp for stamp, _ in stamps]
    first, last = min(times), max(times)
    after_first = sum(1 for stamp in times if stamp > first)
    return after_first / (max(1, last - first) / 1000)


# --- D1 -------------------------------------------------------------------------------------


def fill_due_tier(bootstrap: str, tiers: Tiers, target: str, records: int) -> None:
    """`records` records on the smallest tier that are all due by the time a service reads them."""
    producer = fast_producer(bootstrap)
    for index in range(records):
        schedule(producer, target, payload(index), tiers=tiers, delay="100ms")
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    time.sleep(tiers.smallest_ms / 1000)


def service_rate(bootstrap: str, records: int, *, at_least_once: bool) -> float:
    tiers = new_tiers()
    ensure_topics(quiet(bootstrap), tiers, PARTITIONS)
    target = new_topic(bootstrap, "target")
    fill_due_tier(bootstrap, tiers, target, records)
    service = Service(bootstrap, tiers, at_least_once=at_least_once)
    try:
        # Read the target only afterwards: a reader beside it would take CPU from the service,
        # which the raw loop does not have to share.
        service.wait_for("redrive_forwarded_total", records, 300,
                         f"forwarded too few of {records}")
    finally:
        service.stop()
    return rate_of(read_timestamps(bootstrap, target, records, timeout_s=60))


def raw_rate(bootstrap: str, records: int, *, transactional: bool) -> float:
    """The raw loop in a process of its own, as the service runs, on a freshly filled tier."""
    tiers = new_tiers()
    ensure_topics(quiet(bootstrap), tiers, PARTITIONS)
    fill_due_tier(bootstrap, tiers, new_topic(bootstrap, "unused"), records)
    target = new_topic(bootstrap, "raw")
    subprocess.run([sys.executable, __file__, "--raw-loop", tiers.topics[0], target, str(records),
                    "--bootstrap", bootstrap, *(["--transactional"] if transactional else [])],
                   check=True, timeout=300)
    return rate_of(read_timestamps(bootstrap, target, records, timeout_s=60))


def raw_loop(bootstrap: str, source: str, target: str, records: int,
             transactional: bool) -> None:
    """Consume and produce with no gate and no headers read, with the service's commit
    discipline and batching (poll, then drain what is already fetched)."""
    # The service's client settings, so that the ratio shows what redrive's own work costs.
    consumer = kafka.consumer(quiet(bootstrap), f"bench-raw-{uuid.uuid4().hex[:8]}",
                              CONSUMER_SETTINGS)
    producer = kafka.producer(quiet(bootstrap), transactional_id=(
        f"bench-raw-{uuid.uuid4().hex[:8]}" if transactional else None),
        overrides=PRODUCER_SETTINGS)
    if transactional:
        producer.init_transactions()
    consumer.subscribe([source])
    committed: dict[tuple[str, int], int] = {}
    done = 0
    deadline = time.monotonic() + 300
    while done < records and time.monotonic() < deadline:
        first = consumer.poll(0.2)
        if first is None or first.error() is not None:
            continue
        messages = [first, *(m for m in consumer.consume(4_999, 0) if m.error() is None)]
        stamp = now_ms()
        out = [kafka.OutRecord(target, m.value(), m.key(), kafka.message_headers(m),
                               timestamp_ms=stamp) for m in messages]
        ends: dict[tuple[str, int], int] = {}
        for message in messages:
            ends[(str(message.topic()), int(message.partition() or 0))] = int(
                message.offset() or 0) + 1
        offsets = [TopicPartition(t, p, o) for (t, p), o in ends.items()]
        if transactional:
            producer.begin_transaction()
            for record in out:
                kafka.produce(producer, record)
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            producer.commit_transaction()
        else:
            kafka.produce_acked(producer, out)
            consumer.commit(offsets=offsets, asynchronous=True)
            committed.update(ends)
        done += len(messages)
    if committed:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in committed.items()],
                        asynchronous=False)
    consumer.close()


@dataclass(frozen=True)
class Paired:
    """The service's and the raw loop's rates, one pair per round."""

    service: list[float]
    raw: list[float]

    @property
    def ratios(self) -> list[float]:
        return [s / r for s, r in zip(self.service, self.raw, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)


def paired(service: Callable[[], float], raw: Callable[[], float], meter: CpuMeter,
           rounds: int = 3) -> Paired:
    """Each round runs both, alternating which goes first, each on an idle broker: the
    machine's speed drifts between minutes, so a ratio is taken only between runs made side by
    side, and neither is charged with the rewrite the other set off."""
    out = Paired([], [])
    for round_ in range(rounds):
        runs = [(service, out.service), (raw, out.raw)]
        for measure, rates in runs if round_ % 2 == 0 else runs[::-1]:
            settle(meter)
            rates.append(measure())
    return out


# --- D2 -------------------------------------------------------------------------------------


def lateness(bootstrap: str, seconds: float) -> dict[str, float]:
    tiers = new_tiers()
    ensure_topics(quiet(bootstrap), tiers, PARTITIONS)
    target = new_topic(bootstrap, "late")
    service = Service(bootstrap, tiers)
    try:
        service.wait_for("redrive_rebalances_total", 1, 120, "was assigned no partition")
        producer = fast_producer(bootstrap)
        total = int(seconds * RATE_PER_S)
        start = time.monotonic()
        for index in range(total):
            # Paced in ticks of 10 ms: 2,000 records/s, delays spread over 0.1-3 s.
            if index % (RATE_PER_S // 100) == 0:
                pause = start + index / RATE_PER_S - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                producer.poll(0)
            delay_ms = 100 + (index * 7919) % 2_900
            schedule(producer, target, payload(index), tiers=tiers, delay=delay_ms / 1000)
        producer.flush(30)
        achieved = total / (time.monotonic() - start)
        stamps = read_timestamps(bootstrap, target, total, timeout_s=60)
    finally:
        service.stop()
    late = sorted(stamp - due for stamp, due in stamps)
    return {
        "scheduled_per_s": round(achieved),
        "lateness_p50_ms": statistics.median(late),
        "lateness_p99_ms": percentile(late, 0.99),
        "lateness_max_ms": late[-1],
        "early": sum(1 for value in late if value < 0),
        "bound_ms": tiers.smallest_ms,
    }


# --- D3 -------------------------------------------------------------------------------------


def add_pending(bootstrap: str, tiers: Tiers, target: str, count: int) -> None:
    producer = fast_producer(bootstrap)
    for index in range(count):
        schedule(producer, target, payload(index), key=str(index).encode(), tiers=tiers,
                 delay="2h")
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)


def settled_rss_mb(bootstrap: str, tiers: Tiers, consumer_config: Sequence[str]) -> float:
    """Peak RSS of a fresh instance once it has paused every partition of the 1 h tier."""
    service = Service(bootstrap, tiers, consumer_config=consumer_config)
    try:
        service.wait_for("redrive_paused_partitions", PARTITIONS, 120,
                         "did not pause every partition")
        time.sleep(2.0)  # a few more polls, resumptions and fetches at the held heads
        return service.peak_rss_mb()
    finally:
        service.stop()


def rss(bootstrap: str, small: int, large: int,
        consumer_config: Sequence[str] = ()) -> dict[str, float]:
    tiers = new_tiers()
    ensure_topics(quiet(bootstrap), tiers, PARTITIONS)
    target = new_topic(bootstrap, "rss")
    add_pending(bootstrap, tiers, target, small)
    small_mb = settled_rss_mb(bootstrap, tiers, consumer_config)
    add_pending(bootstrap, tiers, target, large - small)
    large_mb = settled_rss_mb(bootstrap, tiers, consumer_config)
    return {"rss_small_mb": round(small_mb, 1), "rss_large_mb": round(large_mb, 1),
            "pending_small": small, "pending_large": large}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of noida-db")
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON")
    parser.add_argument("--raw-loop", nargs=3, metavar=("SOURCE", "TARGET", "RECORDS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--transactional", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_loop:
        source, target, records = args.raw_loop
        raw_loop(args.bootstrap, source, target, int(records), args.transactional)
        return 0
    size = QUICK if args.quick else FULL
    brokers: list[DevBroker] = []
    bootstrap = args.bootstrap
    if bootstrap is None:
        brokers.append(DevBroker("noida-db").start(timeout_s=60))
        bootstrap = brokers[0].bootstrap
    started = time.monotonic()
    try:
        n = size.forward_records
        meter = CpuMeter(brokers[0].pid if brokers else None)
        tx = paired(lambda: service_rate(bootstrap, n, at_least_once=False),
                    lambda: raw_rate(bootstrap, n, transactional=True), meter)
        alo = paired(lambda: service_rate(bootstrap, n, at_least_once=True),
                     lambda: raw_rate(bootstrap, n, transactional=False), meter)
        late = lateness(bootstrap, size.lateness_s)
        memory_broker = "the given broker"
        if args.bootstrap is None:
            # noida-db answers a fetch with the whole partition, whatever fetch.max.bytes and
            # max.partition.fetch.bytes say, so any client's memory there grows with the
            # backlog; Tansu honours the limits, as Kafka does.
            brokers[0].close()
            brokers.append(DevBroker("tansu").start(timeout_s=60))
            memory = rss(brokers[-1].bootstrap, size.pending_small, size.pending_large,
                         TANSU_GROUP)
            memory_broker = "tansu"
        else:
            memory = rss(bootstrap, size.pending_small, size.pending_large)
    finally:
        for broker in brokers:
            broker.close()
    bound = late["bound_ms"]
    rows = [
        [f"D1 forwarded/s, {name} (medians of rounds)",
         f"{statistics.median(pair.service):,.0f}",
         f"raw loop {statistics.median(pair.raw):,.0f}",
         f"{pair.ratio:.2f} (rounds {' '.join(f'{r:.2f}' for r in pair.ratios)})"]
        for name, pair in (("transactional", tx), ("at-least-once", alo))
    ] + [
        [f"D2 lateness p50 / p99 / max at {late['scheduled_per_s']:.0f}/s",
         f"{late['lateness_p50_ms']:.0f} / {late['lateness_p99_ms']:.0f} / "
         f"{late['lateness_max_ms']:.0f} ms", f"bound {bound:.0f} ms + 250 ms",
         "ok" if late["lateness_p99_ms"] <= bound + 250 else "MISSED"],
        ["D2 forwarded before due", f"{late['early']:.0f}", "must be 0",
         "ok" if late["early"] == 0 else "MISSED"],
        [f"D3 peak RSS, {memory['pending_small']:,.0f} / {memory['pending_large']:,.0f} pending",
         f"{memory['rss_small_mb']} / {memory['rss_large_mb']} MB", "within 50 MB",
         f"{memory['rss_large_mb'] - memory['rss_small_mb']:+.1f} MB"],
    ]
    print(f"delay service on {brokers[0].kind if brokers else bootstrap} (D3 on "
          f"{memory_broker}), {'quick' if args.quick else 'full'} run, "
          f"{time.strftime('%Y-%m-%d')}, {time.monotonic() - started:.0f} s")
    print(table(["figure", "redrive", "baseline / goal", "ratio / result"], rows))
    if args.json:
        print(json.dumps({
            "forward_ratio": round(tx.ratio, 3),
            "forward_ratio_runs": [round(r, 3) for r in tx.ratios],
            "forward_per_s": round(statistics.median(tx.service)),
            "raw_per_s": round(statistics.median(tx.raw)),
            "forward_ratio_at_least_once": round(alo.ratio, 3),
            "forward_ratio_at_least_once_runs": [round(r, 3) for r in alo.ratios],
            "forward_per_s_at_least_once": round(statistics.median(alo.service)),
            "raw_per_s_at_least_once": round(statistics.median(alo.raw)),
            "lateness_p50_ms": late["lateness_p50_ms"],
            "lateness_p99_ms": late["lateness_p99_ms"],
            "bound_ms": bound, "early": late["early"],
            "rss_10k_mb": memory["rss_small_mb"], "rss_1m_mb": memory["rss_large_mb"],
            "pending_large": memory["pending_large"], "rss_broker": memory_broker,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
