"""Runtimes through a broker outage: a broker of the module's own is SIGKILLed mid-run and
restarted on the same data directory. The delay service and the store scheduler (each
at-least-once) carry on without a restart, report the outage once (a log line and
`redrive_broker_up`), commit nothing unconfirmed, and lose nothing. The consumer through the same
fault, in both modes and at full size, is bench/chaos.py's broker-kill faults (`make chaos`): a
test of it here passed alone and failed once in a full `make test` (records left unhandled after
noida-db's restart; see the issue note)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from redrive import kafka
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers, schedule
from redrive.delay.service import CLOSE_TIMEOUT_S
from redrive.dev.brokers import DevBroker
from redrive.kafka import closing, health
from redrive.kafka.transactions import TransactionalProducer
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore, Scheduler
from redrive.store.rows import Entry
from redrive.store.schema import IN_FLIGHT, PENDING

from .background import Background
from .consumer.conftest import Handled, read_all, wait_until

RECORDS = 3000
OUTAGE_S = 4.0
# noida-db loses what it acknowledged in the last half second or so before a SIGKILL (measured:
# 1,000 records acknowledged 0.5 s before it, none after the restart; all of them 1 s before).
# What a test needs to survive the kill is written this long before it.
DURABLE_S = 1.5
# A consumer's timeout_s, which bounds its stop while the broker does not answer.
STOP_TIMEOUT_S = 5.0
# What a transactional runtime stopped in an outage says of its transaction: its abort too
# timed out (or met its commit), and no new producer is made.
STOPPED_UNSETTLED = "stopping with the transaction of"


def check_reported_once(caplog: pytest.LogCaptureFixture, who: str) -> None:
    """One line when the outage starts, one when it ends, and none per failed request."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(who + ":")]
    assert len([m for m in lines if "cannot be reached" in m]) == 1, lines
    assert len([m for m in lines if "answer again" in m]) == 1, lines


def delay_target(bootstrap: str, name: str) -> str:
    """The target topic of `delay_service(bootstrap, name)`, created."""
    target = f"{name}-target"
    kafka.create_topics(kafka.admin(bootstrap), {target: 1})
    return target


def delay_service(bootstrap: str, name: str, **options: Any) -> DelayService:
    """A delay service with tiers of 100ms and 1s, named for `name`. Transactional forwarding
    does not come back from a noida-db SIGKILL in time (its transaction state is among what
    the broker loses): issue 18 keeps that open, and those tests forward at-least-once."""
    return DelayService(bootstrap, Tiers.of(("100ms", "1s"), prefix=f"{name}.delay"),
                        instance_id=f"{name}-1", partitions=1, group_id=f"{name}-service",
                        **options)


def open_transaction(bootstrap: str, topic: str) -> bool:
    """Whether a transaction is open on a partition of `topic`: its last stable offset is below
    its end."""
    committed, uncommitted = (kafka.consumer(bootstrap, overrides={"isolation.level": level})
                              for level in ("read_committed", "read_uncommitted"))
    try:
        return any(committed.get_watermark_offsets(tp, timeout=10)[1]
                   < uncommitted.get_watermark_offsets(tp, timeout=10)[1]
                   for tp in (TopicPartition(topic, p) for p in
                              range(kafka.partition_count(kafka.admin(bootstrap), topic))))
    finally:
        committed.close()
        uncommitted.close()


def read_to_end(bootstrap: str, group: str, topics: Iterable[str]) -> bool:
    """Whether `group` has committed to the end of each partition 0 of `topics` (a partition
    without a commit reads from its start)."""
    consumer = kafka.consumer(bootstrap, group)
    try:
        for tp in consumer.committed([TopicPartition(t, 0) for t in topics], timeout=10):
            start, end = consumer.get_watermark_offsets(tp, timeout=10)
            if max(tp.offset, start) < end:
                return False
        return True
    finally:
        consumer.close()


def test_the_delay_service_at_least_once_forwards_everything_across_a_broker_restart(
        own_broker: DevBroker, caplog: pytest.LogCaptureFixture) -> None:
    bootstrap = own_broker.bootstrap
    name = f"outage-delay-{time.monotonic_ns()}"
    target = delay_target(bootstrap, name)
    service = delay_service(bootstrap, name, transactional=False)
    tiers = service.tiers
    caplog.set_level(logging.INFO, logger="redrive")
    run = Background(service)
    try:
        producer = kafka.producer(bootstrap)
        for n in range(RECORDS // 3):
            schedule(producer, target, b"%d" % n, delay="5s", tiers=tiers)
        assert producer.flush(30) == 0
        # The service holds the records, due during the outage, when the broker dies.
        time.sleep(DURABLE_S)
        own_broker.kill()
        wait_until(lambda: service.metrics.value("redrive_broker_up") == 0, 60,
                   "redrive_broker_up to drop to 0")
        time.sleep(OUTAGE_S)
        own_broker.start(timeout_s=60)
        arrived = read_all(bootstrap, target, expect=RECORDS // 3, timeout_s=90, idle_s=2)
        wait_until(lambda: service.metrics.value("redrive_broker_up") == 1, 30,
                   "redrive_broker_up back to 1")
    finally:
        run.stop(timeout_s=90)
    assert {int(r.value or b"") for r in arrived} == set(range(RECORDS // 3))
    check_reported_once(caplog, f"delay service {name}-service")


def test_a_transactional_delay_service_reports_a_broker_that_does_not_answer_and_goes_on(
        own_broker: DevBroker, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An aborted transaction was never taken for an outage: with the broker SIGSTOPped as a
    # transaction began (no connection refused to tell librdkafka's error callback),
    # redrive_broker_up stayed 1 for 30 s and more, and the tier partitions were held as if the
    # brokers refused their copies.
    bootstrap = own_broker.bootstrap
    pid = own_broker.pid
    assert pid is not None
    name = f"outage-dtx-{time.monotonic_ns()}"
    target = delay_target(bootstrap, name)
    service = delay_service(bootstrap, name, timeout_s=STOP_TIMEOUT_S)
    commit = TransactionalProducer.commit
    frozen = threading.Event()

    def freeze_then_commit(self: TransactionalProducer, *args: Any, **kwargs: Any) -> None:
        if not frozen.is_set():
            frozen.set()
            os.kill(pid, signal.SIGSTOP)
        commit(self, *args, **kwargs)

    monkeypatch.setattr(TransactionalProducer, "commit", freeze_then_commit)
    caplog.set_level(logging.INFO, logger="redrive")
    producers_before = live_producers()
    producer = kafka.producer(bootstrap)
    for n in range(RECORDS):
        schedule(producer, target, b"%d" % n, delay="300ms", tiers=service.tiers)
    assert producer.flush(30) == 0
    run = Background(service)
    try:
        try:
            wait_until(frozen.is_set, 30, "the service's first transaction")
            wait_until(lambda: service.metrics.value("redrive_broker_up") == 0,
                       STOP_TIMEOUT_S * 4, "redrive_broker_up to drop to 0")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: service.metrics.total("redrive_forwarded_total") >= RECORDS, 90,
                   "every record forwarded once the broker is back")
        wait_until(lambda: service.metrics.value("redrive_broker_up") == 1, 30,
                   "redrive_broker_up back to 1")
    finally:
        run.stop(timeout_s=90)
    held = [r.getMessage() for r in caplog.records if "is read again from offset" in r.getMessage()]
    assert held == []
    arrived = read_all(bootstrap, target, expect=RECORDS, timeout_s=30, idle_s=2)
    assert {int(r.value or b"") for r in arrived} == set(range(RECORDS))
    # The producer replaced after its abort timed out must not live on, reconnecting: the
    # errors of its timed-out calls, which confluent-kafka keeps, held it through their frames.
    del producer
    assert live_producers() <= producers_before
    check_reported_once(caplog, f"delay service {name}-service")


def test_the_delay_service_notices_a_broker_lost_between_a_copy_and_its_commit(
        own_broker: DevBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    # A synchronous commit waited for the broker's return: the service neither reported the
    # outage nor stopped (seen once in CI as "did not stop").
    bootstrap = own_broker.bootstrap
    name = f"outage-commit-{time.monotonic_ns()}"
    target = delay_target(bootstrap, name)
    service = delay_service(bootstrap, name, transactional=False)
    tiers = service.tiers
    acked = kafka.produce_acked
    copies_acked: list[int] = []

    def ack_then_lose_the_broker(*args: Any, **kwargs: Any) -> int:
        count = acked(*args, **kwargs)
        copies_acked.append(count)
        if len(copies_acked) == 1:
            own_broker.kill()
        return count

    monkeypatch.setattr(kafka, "produce_acked", ack_then_lose_the_broker)
    producers_before = live_producers()
    producer = kafka.producer(bootstrap)
    for n in range(100):
        schedule(producer, target, b"%d" % n, delay="300ms", tiers=tiers)
    assert producer.flush(30) == 0
    time.sleep(DURABLE_S)
    run = Background(service)
    try:
        wait_until(lambda: service.metrics.value("redrive_broker_up") == 0, 30,
                   "redrive_broker_up to drop to 0 while the commit has no broker")
        own_broker.start(timeout_s=60)
        arrived = read_all(bootstrap, target, expect=100, timeout_s=60, idle_s=1)
    finally:
        started = time.monotonic()
        run.stop(timeout_s=60)
    assert time.monotonic() - started < 15
    # At least once: the first batch's commit was lost with the broker, so it may come twice.
    assert {int(r.value or b"") for r in arrived} == set(range(100))
    assert copies_acked[0] > 0
    # The producer that failed for good after the restart (OUT_OF_ORDER_SEQUENCE_NUMBER) was
    # replaced and must not live on, reconnecting: confluent-kafka holds on to the exception
    # that reported its failure (kafka.produce._flush). The stopped service keeps no producer.
    del producer
    assert live_producers() <= producers_before


def live_producers() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Producer))


def test_the_store_scheduler_publishes_every_row_once_the_broker_is_back(
        own_broker: DevBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bootstrap = own_broker.bootstrap
    topic, group = f"outage-store-{time.monotonic_ns()}", "outage-store"
    kafka.create_topics(kafka.admin(bootstrap), {topic: 1})
    store = RetryStore(tmp_path / "store.db")
    rows = 200
    store.write([Entry(group=group, topic=topic, partition=0, offset=n, timestamp_ms=None,
                       key=None, mode="payload", value=b"%d" % n, headers=[], target=None,
                       attempt=1, first_failure_ms=now_ms(), due_ms=now_ms() + 3000,
                       status=PENDING, reason=None, error_type="app.Boom",
                       error_message="boom", error_trace=None, ordered=False)
                 for n in range(rows)], [])
    time.sleep(DURABLE_S)  # the topic's creation
    scheduler = Scheduler(store, bootstrap, idle_s=0.02, timeout_s=3.0)
    caplog.set_level(logging.INFO, logger="redrive")
    run = Background(scheduler)
    try:
        time.sleep(1.0)  # started and connected; the rows fall due during the outage
        own_broker.kill()
        wait_until(lambda: scheduler.metrics.value("redrive_broker_up") == 0, 60,
                   "redrive_broker_up to drop to 0")
        time.sleep(OUTAGE_S)
        assert store.counts().get(PENDING) == rows  # nothing marked while nothing was sent
        own_broker.start(timeout_s=60)
        wait_until(lambda: store.counts().get(IN_FLIGHT) == rows, 90, "every row published")
        wait_until(lambda: scheduler.metrics.value("redrive_broker_up") == 1, 30,
                   "redrive_broker_up back to 1")
    finally:
        run.stop(timeout_s=60)
        store.close()
    copies = read_all(bootstrap, topic, expect=rows, timeout_s=30)
    # At least once: a copy a failed pass left queued may arrive beside the next pass's, and
    # the consuming runtime skips the second (same origin and attempt).
    assert {int(r.value or b"") for r in copies} == set(range(rows))
    check_reported_once(caplog, "store scheduler")
    failed = [r for r in caplog.records if "scheduler pass failed" in r.getMessage()]
    assert len(failed) == 0, [r.getMessage() for r in failed]  # the outage's line says it all


def stopped_while_frozen(broker: DevBroker, run: Background,
                         caplog: pytest.LogCaptureFixture) -> float:
    """Seconds that `run` took to stop, asked 1 s after the broker was SIGSTOPped (continued
    once it returned), its warnings in `caplog`."""
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        time.sleep(1)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING):
            run.stop(timeout_s=60)
        return time.monotonic() - started
    finally:
        os.kill(broker.pid, signal.SIGCONT)


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
def test_a_consumer_stopped_while_the_broker_does_not_answer_stops_in_time_and_loses_nothing(
        transactional: bool, own_broker: DevBroker, caplog: pytest.LogCaptureFixture) -> None:
    # librdkafka's close waits for its unanswered commits until the coordinator answers: with
    # the broker SIGSTOPped, stop() had not returned after 400 s. Transactional, the batch's
    # send_offsets_to_transaction waited 60 s (librdkafka's request timeout, whatever the
    # call's own), then its abort and a new producer timeout_s each: 69 s with timeout_s=5.
    bootstrap = own_broker.bootstrap
    topic, group = f"outage-stop-{time.monotonic_ns()}", f"outage-stop-{transactional}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: 2})
    producer = kafka.producer(bootstrap)
    for n in range(RECORDS):
        producer.produce(topic, b"%d" % n)
    assert producer.flush(30) == 0
    calls = Handled()
    succeeded: set[int] = set()
    policy = RetryPolicy(backoff=Backoff.fixed("200ms"), attempts=3)

    def handle(record: Record) -> None:
        calls.add(record)
        time.sleep(0.002)  # still working through the topic when the broker stops answering
        number = int(record.value or b"")
        if number % 10 == 0 and record.delivery.attempt == 0:
            raise ValueError("fails once")
        with calls.lock:
            succeeded.add(number)

    run = Background(RetryingConsumer(bootstrap, topic, group, policy, handle,
                                      timeout_s=STOP_TIMEOUT_S, transactional=transactional))
    wait_until(lambda: len(calls.values()) > 300, 30, "300 records handled before the outage")
    took = stopped_while_frozen(own_broker, run, caplog)
    with calls.lock:
        left_unfinished = RECORDS - len(succeeded)
    # The batch in hand waits timeout_s at most for its copies (transactional: for its
    # transaction's call in progress, then LEAST_S for the abort), the close as long again, and
    # the consumer's close is given at least LEAST_S.
    assert took < 2 * STOP_TIMEOUT_S + (2 if transactional else 1) * closing.LEAST_S + 3, took
    said = [r.getMessage() for r in caplog.records]
    assert any("not answered in time" in m or "did not close in time" in m for m in said), said
    if transactional:
        assert any(m.startswith(STOPPED_UNSETTLED) for m in said), said
    assert left_unfinished > 0  # else the second member below would have nothing to show
    # Nothing lost: another member of the group, started once the broker answers again,
    # succeeds with every number the first one did not finish, the failed ones on a retry.
    again = Background(RetryingConsumer(bootstrap, topic, group, policy, handle,
                                        transactional=transactional))
    try:
        wait_until(lambda: len(succeeded) == RECORDS, 90,
                   "every number handled with success once the broker answers again")
    finally:
        again.stop(timeout_s=60)
    retried = {int(r.value or b"") for r, _ in calls.calls if r.delivery.attempt == 1}
    assert retried == set(range(0, RECORDS, 10))


def test_idle_runtimes_report_a_broker_that_stops_answering_within_seconds(
        own_broker: DevBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # With nothing to commit or send, a runtime's only requests were its fetches, which
    # librdkafka times out after socket.timeout.ms: an idle consumer kept redrive_broker_up at
    # 1 for about a minute of a SIGSTOPped broker. One freeze for a consumer, a delay service
    # and a store scheduler, each with nothing to do.
    bootstrap = own_broker.bootstrap
    assert own_broker.pid is not None
    topic = group = f"outage-idle-{time.monotonic_ns()}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: 1})
    producer = kafka.producer(bootstrap)
    producer.produce(topic, b"0")
    assert producer.flush(30) == 0
    calls = Handled()
    consumer = RetryingConsumer(bootstrap, topic, group, RetryPolicy(attempts=1), calls.add)
    service = delay_service(bootstrap, topic)
    store = RetryStore(tmp_path / "store.db")
    scheduler = Scheduler(store, bootstrap, idle_s=0.05)
    runtimes = {f"group {group}": consumer.metrics,
                f"delay service {topic}-service": service.metrics,
                "store scheduler": scheduler.metrics}
    caplog.set_level(logging.INFO, logger="redrive")
    # Started before the freeze: a start during an outage fails (BrokerUnavailable), which is
    # not what this test is about.
    scheduler.start()
    runs = [Background(consumer), Background(service), Background(scheduler)]
    try:
        wait_until(lambda: len(calls.values()) == 1, 30, "the one record handled")
        wait_until(lambda: bool(service.assignment), 30, "the delay service's tiers assigned")
        os.kill(own_broker.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            for who, metrics in runtimes.items():
                wait_until(lambda m=metrics: m.value("redrive_broker_up") == 0, 30,
                           f"{who}: redrive_broker_up to drop to 0")
            noticed_s = time.monotonic() - stopped
        finally:
            os.kill(own_broker.pid, signal.SIGCONT)
        for who, metrics in runtimes.items():
            wait_until(lambda m=metrics: m.value("redrive_broker_up") == 1, 30,
                       f"{who}: redrive_broker_up back to 1")
        producer.produce(topic, b"1")
        assert producer.flush(30) == 0
        wait_until(lambda: len(calls.values()) == 2, 30, "a record sent after the outage handled")
    finally:
        for run in runs:
            run.stop(timeout_s=60)
        store.close()
    # A quiet spell, a check's timeout and the announcing grace, with room for a loaded machine.
    assert noticed_s < health.QUIET_PROBE_S + health.PROBE_TIMEOUT_S + health.ANNOUNCE_AFTER_S + 5
    assert [int(v or b"") for v in calls.values()] == [0, 1]
    for who in runtimes:
        check_reported_once(caplog, who)


def test_a_transactional_delay_service_stopped_while_the_broker_does_not_answer_stops_in_time(
        own_broker: DevBroker, caplog: pytest.LogCaptureFixture) -> None:
    # The poll's send_offsets_to_transaction waited for its request's timeout (60 s), then the
    # abort and a new producer 30 s each: 120 s by hand with the default timeout_s (30 s).
    bootstrap = own_broker.bootstrap
    name = f"outage-dstop-{time.monotonic_ns()}"
    target = delay_target(bootstrap, name)

    def service() -> DelayService:
        return delay_service(bootstrap, name, timeout_s=STOP_TIMEOUT_S)

    first = service()
    tiers = first.tiers
    run = Background(first)
    producer = kafka.producer(bootstrap)
    for n in range(10 * RECORDS):
        schedule(producer, target, b"%d" % n, delay="100ms", tiers=tiers)
    assert producer.flush(30) == 0
    wait_until(lambda: first.metrics.total("redrive_forwarded_total") > 0, 30,
               "forwarding before the outage")
    took = stopped_while_frozen(own_broker, run, caplog)
    # The call in progress (timeout_s), the abort and the producer's flush (LEAST_S each), the
    # consumer's close (CLOSE_TIMEOUT_S at most).
    assert took < STOP_TIMEOUT_S + 2 * closing.LEAST_S + CLOSE_TIMEOUT_S + 3, took
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(STOPPED_UNSETTLED) for m in said), said
    # A commit under way at the stop is committed once the broker answers again, and the first
    # service never counts it: the records that arrive are the count. Apache Kafka keeps a
    # group's offsets from a new member while a transaction holding some is open
    # (UNSTABLE_OFFSET_COMMIT); noida-db answers with the older ones at once
    # (test_chaos_quick.py), and the restarted service would forward that transaction's records
    # again. So the test ends the first service's transaction before the restart: its id's next
    # producer aborts it if open, and a commit already on its way is waited for.
    fence = TransactionalProducer(bootstrap, f"{first.group_id}.{first.instance_id}")
    fence.start()
    fence.close()
    wait_until(lambda: not open_transaction(bootstrap, target), 30,
               "the first service's last transaction ended on the broker")
    # Nothing lost: the same instance, started again, forwards every record once.
    again = Background(service())
    try:
        # Read once all is forwarded: on noida-db a reader reading along past the first
        # service's aborted transaction misses the same transactional id's later records
        # (docs/benchmarks.md).
        wait_until(lambda: read_to_end(bootstrap, first.group_id, tiers.topics), 90,
                   "every record forwarded by the restarted service")
        arrived = read_all(bootstrap, target, expect=10 * RECORDS, timeout_s=30, idle_s=2)
    finally:
        again.stop(timeout_s=60)
    values = [int(r.value or b"") for r in arrived]
    assert sorted(values) == list(range(10 * RECORDS))
