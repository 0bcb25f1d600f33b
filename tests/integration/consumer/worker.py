"""A RetryingConsumer in its own process, for the SIGTERM and crash tests.

Records are decimal numbers. The handler appends one line per call to --log, flushed before it
returns: "<value> <attempt> <topic> <partition> <offset> <ok|fail> <now_ms> <due_ms>". With
--fail-every K, numbers divisible by K fail their first delivery; with --dead-every D, numbers
divisible by D always fail (and end in the dead-letter topic).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from redrive.consumer import RetryingConsumer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record


class Flaky(Exception):
    pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--instance", default=None, help="group.instance.id (static member)")
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--delay", default="500ms")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--dead-every", type=int, default=0)
    parser.add_argument("--handler-ms", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()

    out = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime

    def handler(record: Record) -> None:
        if args.handler_ms:
            time.sleep(args.handler_ms / 1000)
        number = int(record.value or b"0")
        fails = bool(args.dead_every and number % args.dead_every == 0) or bool(
            args.fail_every and number % args.fail_every == 0 and record.delivery.attempt == 0)
        now = time.time_ns() // 1_000_000
        out.write(f"{number} {record.delivery.attempt} {record.topic} {record.partition} "
                  f"{record.offset} {'fail' if fails else 'ok'} {now} "
                  f"{record.delivery.due_ms if record.delivery.due_ms is not None else -1}\n")
        out.flush()
        if fails:
            raise Flaky(f"{number} fails")

    config: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    if args.instance:
        config["group.instance.id"] = args.instance
    policy = RetryPolicy(backoff=Backoff.fixed(args.delay), attempts=args.attempts)
    consumer = RetryingConsumer(args.bootstrap, args.topic, args.group, policy, handler,
                                transactional=args.transactional, config=config,
                                batch_size=args.batch_size)
    consumer.start()
    print("started", flush=True)
    consumer.run()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
