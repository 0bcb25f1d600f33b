"""The faults on the services beside the consumer: the delay service and the store scheduler,
each SIGKILLed (or SIGTERMed) twice while a consumer sends its failures through it."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

from chaoslib.count import (
    AT_LEAST_ONCE,
    CLEAN_STOP,
    TRANSACTIONAL,
    Outcome,
    copy_key,
    read_topic,
    repeats,
    waiting,
)
from chaoslib.faults import RESTART_PAUSE_S, Sizes
from chaoslib.procs import Part, python
from chaoslib.runs import ConsumerRun, unique
from redrive import kafka
from redrive.store import RetryStore
from redrive.store.rows import RowFilter
from redrive.store.schema import DEAD, IN_FLIGHT, PENDING, SUCCEEDED

TIERS = ("100ms", "1s")
KILLS_AT = (0.3, 0.6)


def name_of(how: signal.Signals) -> str:
    return "SIGKILL" if how == signal.SIGKILL else "SIGTERM"


def interrupt(part: Part, how: signal.Signals) -> None:
    part.wait_ready()
    if how == signal.SIGKILL:
        part.kill()
        time.sleep(RESTART_PAUSE_S)
    else:
        part.terminate()
    part.start()


def wait_topics(bootstrap: str, topics: list[str], timeout_s: float = 60.0) -> None:
    admin = kafka.admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    while not set(topics) <= set(kafka.topic_partitions(admin)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {topics} not created within {timeout_s:.0f} s")
        time.sleep(0.1)


def forwarded_twice(run: ConsumerRun) -> int:
    """Copies that came back to the main topic (from the tiers or the store) more than once."""
    copies = [r for r in read_topic(run.bootstrap, run.topic) if r.header("redrive-group")]
    return repeats(Counter(copy_key(c) for c in copies))


def delay_service(bootstrap: str, scratch: Path, sizes: Sizes, how: signal.Signals) -> Outcome:
    """Failures go through the delay service's tiers (DelayQueue); the service is interrupted
    twice while forwarding and started again with the same instance id."""
    fault = f"delay service {name_of(how)} x2 while forwarding"
    prefix, group = unique("tiers"), unique("delay-g")
    run = ConsumerRun(bootstrap, scratch, f"delay-{name_of(how)}", sizes.records(10_000, 1_000),
                      handler_ms=0.5, worker_args=["--tiers", f"{prefix}:{','.join(TIERS)}"])
    service = run.add(Part("delay service", python(
        "-m", "redrive", "delay", "run", "--bootstrap", bootstrap, "--tiers", ",".join(TIERS),
        "--prefix", prefix, "--group", group, "--instance-id", "delay-1", "--partitions", "2"),
        scratch / f"delay-{name_of(how)}.service.out", ready_text=" assigned "))
    tier_topics = [f"{prefix}.{tier}" for tier in TIERS]
    try:
        service.start()
        wait_topics(bootstrap, tier_topics)
        run.worker("a").start()
        for at in KILLS_AT:
            run.wait_progress(at)
            interrupt(service, how)
        done = run.wait_finished(run.dead, sizes.finish_s)
        run.stop_all()
        outcome = run.outcome(fault, TRANSACTIONAL if how == signal.SIGKILL else CLEAN_STOP)
        if not done:
            outcome.notes.append(run.unfinished_note(sizes.finish_s))
        in_flight = {r.number for r in waiting(bootstrap, group, tier_topics)}
        tiers_waiting = len(in_flight)
        in_flight |= {r.number for r in waiting(bootstrap, run.group, [run.topic])}
        if tiers_waiting and not done:
            outcome.notes.append(
                f"{tiers_waiting} copies wait in the tiers past the service group's commit")
        # The service forwards exactly once; the consumer (not interrupted) handles what comes.
        return outcome.tally(run.expected, run.successes(), run.dead(), in_flight=in_flight,
                             copies_twice=forwarded_twice(run),
                             sink_covered=how != signal.SIGKILL)
    finally:
        run.abandon()


def store_scheduler(bootstrap: str, scratch: Path, sizes: Sizes, url: str, database: str,
                    how: signal.Signals) -> Outcome:
    """Failures wait in a retry store; its scheduler (`redrive store run`) is interrupted twice
    while it republishes due rows, and started again."""
    fault = f"store scheduler {name_of(how)} x2 ({database})"
    name = f"store-{database}-{name_of(how)}"
    run = ConsumerRun(bootstrap, scratch, name, sizes.records(5_000, 1_000), handler_ms=0.5,
                      worker_args=["--store", url])
    store = RetryStore(url)

    def publishing(part: Part) -> bool:
        """It republished a row since it started: it is in its passes."""
        rows = store.find(RowFilter(group=run.group, statuses=(IN_FLIGHT, SUCCEEDED, DEAD)),
                          limit=None)
        return any((row.dispatched_ms or 0) >= part.started_ms for row in rows)

    scheduler = run.add(Part("store scheduler", python(
        "-m", "redrive", "store", "run", "--bootstrap", bootstrap, "--lease", "20s"),
        scratch / f"{name}.scheduler.out", {"REDRIVE_STORE_URL": url}, ready=publishing))
    try:
        run.worker("a").start()
        run.wait_progress(0.05)  # the worker made the store's schema
        scheduler.start()

        def dead() -> Counter[int]:
            return Counter(int(row.value or b"-1") for row in
                           store.find(RowFilter(group=run.group, statuses=(DEAD,)), limit=None))

        for at in KILLS_AT:
            run.wait_progress(at)
            interrupt(scheduler, how)
        done = run.wait_finished(dead, sizes.finish_s)
        run.stop_all()
        outcome = run.outcome(fault, AT_LEAST_ONCE if how == signal.SIGKILL else CLEAN_STOP)
        if not done:
            outcome.notes.append(run.unfinished_note(sizes.finish_s))
        rows = store.find(RowFilter(group=run.group, statuses=(PENDING, IN_FLIGHT)), limit=None)
        in_flight = {int(row.value or b"-1") for row in rows}
        in_flight |= {r.number for r in waiting(bootstrap, run.group, [run.topic])}
        twice = forwarded_twice(run)
        if twice:
            outcome.notes.append(f"{twice} rows republished twice (recognised: the handler "
                                 "did not see them again)")
        return outcome.tally(run.expected, run.successes(), dead(), in_flight=in_flight)
    finally:
        store.close()
        run.abandon()
