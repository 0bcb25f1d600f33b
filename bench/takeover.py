"""How often a read_committed reader passes over committed records around a transactional takeover.

    python bench/takeover.py [--runs N] [--partitions P] [--after-init] [--bootstrap HOST:PORT]

A probe of the broker, not of redrive: only confluent-kafka clients take part. Starts its own
noida-db unless --bootstrap is given. Each run: producer A (its own process) writes small
transactions over P partitions and is SIGKILLed mid-stream, leaving one open; producer B takes
its transactional id over and writes for two seconds; a read_committed reader reads along (from
the start, or with --after-init from the moment B's init_transactions returned). Then a new
read_committed reader reads the topic. A run counts when the reader that read along missed
records the new one reads: it passed over them, its position at the end. On Apache Kafka no run
should count: a takeover returns once the old transaction's abort markers are written.
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
bootstrap, topic, tid, tag, partitions, seconds = sys.argv[1:7]
producer = kafka.producer(bootstrap, transactional_id=tid)
producer.init_transactions(30)
print("ready", flush=True)
end, k = time.monotonic() + float(seconds), 0
while time.monotonic() < end:
    producer.begin_transaction()
    for _ in range(5):
        k += 1
        producer.produce(topic, b"%s-%d" % (tag.encode(), k), partition=k % int(partitions))
    producer.commit_transaction(10)
"""

Key = tuple[int, int]  # partition, offset


class Reader:
    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer: Consumer = kafka.consumer(bootstrap, f"takeover-{uuid.uuid4().hex}")
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
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
           seconds: float) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", WRITER, bootstrap, topic, tid, tag,
                                str(partitions), str(seconds)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        process.stdout.readline()  # its init_transactions returned
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def one_run(bootstrap: str, partitions: int, after_init: bool) -> tuple[int, int, list[int]]:
    """(records committed, records the reader that read along missed, partitions it missed on)"""
    topic = f"takeover-{uuid.uuid4().hex[:8]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: partitions})
    tid = f"takeover-{uuid.uuid4().hex[:8]}"
    along = None if after_init else Reader(bootstrap, topic, partitions)
    with writer(bootstrap, topic, tid, "a", partitions, 60.0):
        if along is not None:
            along.read_for(random.uniform(0.3, 1.2))
        else:
            time.sleep(random.uniform(0.3, 1.2))
    with writer(bootstrap, topic, tid, "b", partitions, 2.0) as second:
        along = along or Reader(bootstrap, topic, partitions)
        while second.poll() is None:
            along.read_for(0.2)
    along.read_until_quiet()
    along.consumer.close()
    fresh = Reader(bootstrap, topic, partitions)
    fresh.read_until_quiet()
    fresh.consumer.close()
    missed = set(fresh.seen) - set(along.seen)
    return len(fresh.seen), len(missed), sorted({p for p, _ in missed})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--after-init", action="store_true",
                        help="start the reader once the new producer's takeover returned")
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(DevBroker()).bootstrap
        counted = 0
        for run in range(args.runs):
            committed, missed, where = one_run(bootstrap, args.partitions, args.after_init)
            if missed:
                counted += 1
                print(f"run {run}: {committed} records committed; the reader that read along "
                      f"passed over {missed} of them, on partitions {where}", flush=True)
        print(f"{counted} of {args.runs} runs: a read_committed reader passed over committed "
              f"records ({args.partitions} partitions, reader "
              f"{'started after the takeover' if args.after_init else 'reading along'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
