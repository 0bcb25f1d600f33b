"""A RetryingConsumer in its own process, as the chaos faults run it.

    python -m chaoslib.worker --bootstrap B --topic T --group G --log FILE [options]

The handler follows `workload` (or, with --no-failures, always succeeds) and appends one line per
call to --log, flushed before it returns: "<number> <attempt> <topic> <partition> <offset>
<ok|fail> <pid> <time>". That log is the sink the faults count successes in. Failed records wait
in the group's retry topics, in the delay service's tiers (--tiers PREFIX:D1,D2) or in a retry
store (--store URL).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from chaoslib import workload
from redrive.backends import DelayQueue, RetryBackend
from redrive.consumer import RetryingConsumer
from redrive.delay import Tiers
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, StoreBackend


def backend(args: argparse.Namespace) -> RetryBackend | None:
    if args.tiers:
        prefix, _, durations = args.tiers.partition(":")
        return DelayQueue(Tiers.of(durations.split(","), prefix=prefix))
    if args.store:
        return StoreBackend(RetryStore(args.store))
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--instance", default=None, help="group.instance.id (static member)")
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--no-failures", action="store_true")
    parser.add_argument("--handler-ms", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--tiers", default=None, help="PREFIX:D1,D2 (through the delay queue)")
    parser.add_argument("--store", default=None, help="a retry store's URL")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("CHAOS_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")

    pid = os.getpid()
    out = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime

    def handler(record: Record) -> None:
        if args.handler_ms:
            time.sleep(args.handler_ms / 1000)
        number = int(record.value or b"-1")
        failed = not args.no_failures and workload.fails(number, record.delivery.attempt)
        out.write(f"{number} {record.delivery.attempt} {record.topic} {record.partition} "
                  f"{record.offset} {'fail' if failed else 'ok'} {pid} {time.time():.3f}\n")
        out.flush()
        if failed:
            raise workload.Flaky(f"{number} fails")

    config: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    if args.instance:
        config["group.instance.id"] = args.instance
    policy = RetryPolicy(backoff=Backoff.fixed(workload.DELAY), attempts=workload.ATTEMPTS)
    consumer = RetryingConsumer(args.bootstrap, args.topic, args.group, policy, handler,
                                transactional=args.transactional, config=config,
                                batch_size=args.batch_size, retry_backend=backend(args))
    consumer.start()
    print("started", flush=True)
    consumer.run()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
