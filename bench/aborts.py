"""How often a read_committed reader passes over committed records after a transaction is aborted.

    python bench/aborts.py [--case abort|takeover|takeover-after-init|start-past-abort]
                           [--runs N] [--partitions P] [--bootstrap HOST:PORT]

A probe of the broker, not of redrive: only confluent-kafka clients take part. Starts its own
noida-db unless --bootstrap is given. A producer (its own process) writes transactions of 5
records over P partitions while a read_committed reader reads along, then a new read_committed
reader reads the topic. A run counts when the reader that read along missed records the new one
reads: it passed over them, its position at the end. The cases:

- abort: the producer aborts one transaction mid-stream and goes on committing;
- takeover: producer A is SIGKILLed mid-stream, leaving a transaction open; producer B takes its
  transactional id over (which aborts it) and writes for two seconds;
- takeover-after-init: the same, the reader starting once B's init_transactions returned;
- start-past-abort: the abort case with no reader along; once the producer is done, a reader
  starts on each partition the abort wrote, just past the abort's marker, and is compared with
  the new reader's records from there.

What the cases share: noida-db lists an aborted transaction in its answer to a fetch that begins
past the transaction's marker, and librdkafka then takes every later record of that producer in
the partition for an aborted one, as no marker follows. Apache Kafka lists only the aborted
transactions that end at or past the fetch's offset (its transaction index's
collectAbortedTxns), so no run should count there.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from confluent_kafka import Consumer, TopicPartition

from redrive import kafka
from redrive.dev.brokers import DevBroker

WRITER = r"""
import sys, time
from redrive import kafka
bootstrap, topic, tid, tag, partitions, seconds, abort_at = sys.argv[1:8]
producer = kafka.producer(bootstrap, transactional_id=tid)
producer.init_transactions(30)
print("ready", flush=True)
start, k, aborted = time.monotonic(), 0, float(abort_at) < 0
while time.monotonic() < start + float(seconds):
    producer.begin_transaction()
    for _ in range(5):
        k += 1
        producer.produce(topic, b"%s-%d" % (tag.encode(), k), partition=k % int(partitions))
    if not aborted and time.monotonic() >= start + float(abort_at):
        producer.flush(10)
        producer.abort_transaction(10)
        aborted = True
    else:
        producer.commit_transaction(10)
"""

Key = tuple[int, int]  # partition, offset
CASES = ("abort", "takeover", "takeover-after-init", "start-past-abort")


class Reader:
    def __init__(self, bootstrap: str, topic: str, starts: dict[int, int], *,
                 isolation: str = "read_committed") -> None:
        self.consumer: Consumer = kafka.consumer(bootstrap, f"aborts-{uuid.uuid4().hex}",
                                                 {"isolation.level": isolation})
        self.consumer.assign([TopicPartition(topic, p, at) for p, at in starts.items()])
        self.seen: dict[Key, bytes] = {}

    def read_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            message = self.consumer.poll(0.05)
            if message is not None and message.error() is None:
                self.seen[(message.partition() or 0, message.offset() or 0)] = \
                    message.value() or b""

    def read_until_quiet(self, quiet_s: float = 1.5) -> None:
        while True:
            before = len(self.seen)
            self.read_for(quiet_s)
            if len(self.seen) == before:
                return


@contextmanager
def writer(bootstrap: str, topic: str, tid: str, tag: str, partitions: int,
           seconds: float, abort_at: float = -1.0) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", WRITER, bootstrap, topic, tid, tag,
                                str(partitions), str(seconds), str(abort_at)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        process.stdout.readline()  # its init_transactions returned
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def read_all(bootstrap: str, topic: str, partitions: int,
             isolation: str = "read_committed") -> dict[Key, bytes]:
    reader = Reader(bootstrap, topic, dict.fromkeys(range(partitions), 0), isolation=isolation)
    reader.read_until_quiet()
    reader.consumer.close()
    return reader.seen


def one_run(bootstrap: str, partitions: int, case: str) -> tuple[int, int, list[int]]:
    """(records committed, records the reader that read along missed, partitions it missed on)"""
    topic = f"aborts-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: partitions})
    tid = f"aborts-{uuid.uuid4().hex[:8]}"
    if case == "start-past-abort":
        return past_abort_run(bootstrap, topic, tid, partitions)
    from_start = dict.fromkeys(range(partitions), 0)
    along = None if case == "takeover-after-init" else Reader(bootstrap, topic, from_start)
    if case != "abort":
        with writer(bootstrap, topic, tid, "a", partitions, 60.0):
            if along is not None:
                along.read_for(random.uniform(0.3, 1.2))
            else:
                time.sleep(random.uniform(0.3, 1.2))
    abort_at = random.uniform(0.3, 1.2) if case == "abort" else -1.0
    with writer(bootstrap, topic, tid, "b", partitions, 2.0, abort_at) as last:
        along = along or Reader(bootstrap, topic, from_start)
        while last.poll() is None:
            along.read_for(0.2)
    along.read_until_quiet()
    along.consumer.close()
    fresh = read_all(bootstrap, topic, partitions)
    missed = set(fresh) - set(along.seen)
    return len(fresh), len(missed), sorted({p for p, _ in missed})


def past_abort_run(bootstrap: str, topic: str, tid: str,
                   partitions: int) -> tuple[int, int, list[int]]:
    with writer(bootstrap, topic, tid, "b", partitions, 2.0, random.uniform(0.3, 1.2)) as last:
        last.wait()
    fresh = read_all(bootstrap, topic, partitions)
    aborted = set(read_all(bootstrap, topic, partitions, "read_uncommitted")) - set(fresh)
    # Past the last aborted record of each partition and its marker (one producer writes).
    starts = {p: max(o for q, o in aborted if q == p) + 2 for p, _ in aborted}
    late = Reader(bootstrap, topic, starts)
    late.read_until_quiet()
    late.consumer.close()
    wanted = {(p, o) for p, o in fresh if p in starts and o >= starts[p]}
    missed = wanted - set(late.seen)
    return len(wanted), len(missed), sorted({p for p, _ in missed})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--case", choices=CASES, default="abort")
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(DevBroker()).bootstrap
        counted = 0
        reader = ("the reader started past the abort" if args.case == "start-past-abort"
                  else "the reader that read along")
        for run in range(args.runs):
            committed, missed, where = one_run(bootstrap, args.partitions, args.case)
            if missed:
                counted += 1
                print(f"run {run}: {committed} records committed; {reader} passed over "
                      f"{missed} of them, on partitions {where}", flush=True)
        print(f"{counted} of {args.runs} runs: a read_committed reader passed over committed "
              f"records ({args.partitions} partitions, case {args.case})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
