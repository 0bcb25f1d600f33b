"""BrokerHealth: when an outage is announced, when it ends, and how often the brokers are asked."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive.errors import DeliveryFailed
from redrive.kafka import health as health_module
from redrive.kafka.health import BrokerHealth
from redrive.kafka.produce import delivery_failed, producer_failed
from redrive.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Cluster:
    """A client whose metadata requests fail while `up` is False."""

    def __init__(self) -> None:
        self.up = False
        self.asked: list[float] = []
        self.topics: list[str | None] = []

    def list_topics(self, topic: str | None = None, *, timeout: float = -1) -> Any:
        self.asked.append(timeout)
        self.topics.append(topic)
        if not self.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()


@pytest.fixture(autouse=True)
def quick_announce(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_module, "ANNOUNCE_AFTER_S", 0.05)


def down_error() -> KafkaError:
    return KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_an_outage_is_announced_once_then_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics("consumer", "g")
    health = BrokerHealth("group once", metrics)
    assert metrics.value("redrive_broker_up") == 1
    caplog.set_level(logging.INFO, logger="redrive")
    for _ in range(5):
        health.on_error(down_error())
    wait_for(lambda: metrics.value("redrive_broker_up") == 0)
    health.trouble("again")
    health.ok()
    health.ok()
    # Only this health's lines: an outage begun by an earlier test's runtime may be announced
    # now, from its timer.
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("group once:")]
    assert len(lines) == 2, lines
    assert "group once: the brokers cannot be reached (1/1 brokers are down)" in lines[0]
    assert lines[1].startswith("group once: the brokers answer again after")
    assert metrics.value("redrive_broker_up") == 1
    assert health.outages == 1 and not health.down


def test_a_blip_shorter_than_the_grace_is_not_announced(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics("delay", "g")
    health = BrokerHealth("delay service", metrics)
    caplog.set_level(logging.INFO, logger="redrive")
    health.on_error(down_error())
    assert health.down
    health.ok()
    time.sleep(0.1)  # past the grace: the timer was cancelled
    assert [r for r in caplog.records if r.getMessage().startswith("delay service:")] == []
    assert metrics.value("redrive_broker_up") == 1 and health.outages == 0


def test_errors_that_are_not_an_outage_change_nothing() -> None:
    health = BrokerHealth("x")
    health.on_error(KafkaError(KafkaError._TRANSPORT, "one broker of several"))
    assert not health.failed(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not health.failed(DeliveryFailed("t", 0, "record too large"))
    assert not health.down
    assert health.failed(DeliveryFailed("t", None, "unconfirmed after 30s", unanswered=True))
    assert health.down
    health.ok()  # its announcing timer would fire 3 s later, in another test


def test_an_exception_raised_from_an_unanswered_request_is_an_outage() -> None:
    health = BrokerHealth("x")
    try:
        try:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer"))
        except KafkaException as timed_out:
            raise RuntimeError("the transaction was aborted") from timed_out
    except RuntimeError as wrapper:
        assert health.failed(wrapper)
    assert health.down
    health.ok()
    refused = RuntimeError("aborted")
    refused.__cause__ = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert not health.failed(refused) and not health.down


def test_checks_back_off_while_down_and_a_good_one_ends_the_outage() -> None:
    clock = Clock()
    health = BrokerHealth("x", clock=clock)
    cluster = Cluster()
    health.trouble("gone")
    asked_at = []
    for _ in range(320):  # 40 s of a loop turning every 125 ms (exact in binary)
        clock.now += 0.125
        before = len(cluster.asked)
        health.tick(cluster)
        if len(cluster.asked) > before:
            asked_at.append(clock.now - 100.0)
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert asked_at[0] == 0.5
    assert gaps[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert max(gaps) <= health_module.MAX_PROBE_S
    assert all(t == health_module.PROBE_TIMEOUT_S for t in cluster.asked)
    cluster.up = True
    clock.now += health_module.MAX_PROBE_S
    health.tick(cluster)
    assert not health.down


def test_a_quiet_runtime_asks_once_per_quiet_spell_and_an_unanswered_check_is_an_outage() -> None:
    clock = Clock()
    health = BrokerHealth("x", clock=clock, topic="orders")
    cluster = Cluster()
    cluster.up = True
    quiet = health_module.QUIET_PROBE_S
    asked_at = []
    for turn in range(1, 161):  # 20 s of a loop turning every 125 ms
        clock.now += 0.125
        if turn == 80:
            health.ok()  # a commit at 10 s: the brokers were heard from
        before = len(cluster.asked)
        health.tick(cluster)
        if len(cluster.asked) > before:
            asked_at.append(clock.now - 100.0)
    assert asked_at == [quiet, 10.0 + quiet, 10.0 + 2 * quiet]  # none at 10 s, after the commit
    assert not health.down
    cluster.up = False
    clock.now += quiet
    health.tick(cluster)
    assert health.down and cluster.asked[-1] == health_module.PROBE_TIMEOUT_S
    assert set(cluster.topics) == {"orders"}  # not the whole cluster's metadata
    health.ok()  # its announcing timer would fire later, in another test


def test_a_quiet_check_refused_for_another_reason_is_not_an_outage() -> None:
    clock = Clock()
    health = BrokerHealth("x", clock=clock)

    class Refusing:
        def list_topics(self, topic: str | None = None, *, timeout: float = -1) -> Any:
            raise KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED))

    clock.now += health_module.QUIET_PROBE_S
    health.tick(Refusing())
    assert not health.down


def test_watch_keeps_the_users_own_error_callback() -> None:
    seen: list[int] = []
    health = BrokerHealth("x")
    config = health.watch({"bootstrap.servers": "b:9092",
                           "error_cb": lambda e: seen.append(e.code())})
    config["error_cb"](down_error())
    assert seen == [KafkaError._ALL_BROKERS_DOWN] and health.down
    health.ok()  # its announcing timer would fire 3 s later, in another test
    assert health.watch("b:9092")["bootstrap.servers"] == "b:9092"


@pytest.mark.parametrize("code", [KafkaError._FATAL, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                  KafkaError.UNKNOWN_PRODUCER_ID])
def test_a_producer_failed_for_good_is_recognised_without_the_fatal_flag(code: int) -> None:
    # librdkafka raises `_FATAL` from produce() after its fatal error with fatal() False.
    error = KafkaError(code, "as librdkafka reports it")
    assert not error.fatal()
    assert producer_failed(KafkaException(error))
    assert delivery_failed("t", 0, error).fatal
    assert not producer_failed(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)))
    # confluent-kafka raises a delivery callback's error as a SystemError caused by it.
    try:
        try:
            raise KafkaException(error)
        except KafkaException as exc:
            raise SystemError("error return without exception set") from exc
    except SystemError as raised:
        assert producer_failed(raised)
    assert not producer_failed(SystemError("unrelated"))


def test_an_outage_ending_while_it_is_announced_leaves_the_gauge_up() -> None:
    """The announcing timer held inside its log line (as a slow log handler would) while the
    outage ends: the gauge must end as the health does, up."""
    class Gauge:
        up: bool | None = None

        def broker_up(self, up: bool) -> None:
            self.up = up

    in_log, go_on = threading.Event(), threading.Event()

    class Slow(logging.Handler):
        def createLock(self) -> None:
            self.lock = None  # type: ignore[assignment]  # a lock would serialise the threads

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("group race: the brokers cannot be reached"):
                in_log.set()
                go_on.wait(5)

    gauge = Gauge()
    health = BrokerHealth("group race", gauge)
    handler = Slow()
    logger = logging.getLogger("redrive.kafka.health")
    logger.addHandler(handler)
    try:
        health.trouble("all brokers down")
        assert in_log.wait(5)
        health.ok()
        go_on.set()
        time.sleep(0.2)
    finally:
        logger.removeHandler(handler)
    assert not health.down and gauge.up is True
