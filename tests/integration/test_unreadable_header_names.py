"""A record with a header whose name is not UTF-8 (librdkafka-based producers can write any
bytes; kcat here): confluent-kafka cannot read its headers. The consumer and the delay service
dead-letter it as malformed and go on; before, it ended their run() (and a restart met it
again), or crashed the process reading confluent-kafka's half-built header list."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from .background import Running
from .consumer.conftest import FAST_GROUP, Handled, committed, read_all, wait_until
from .delay.conftest import TEST_TIERS, Reader, now_ms, running
from .records import input_producer, produce_input

pytestmark = pytest.mark.integration

BAD_NAME = b"bad\xffname"


def kcat_produce(bootstrap: str, topic: str, value: bytes,
                 headers: list[tuple[bytes, bytes]]) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not on PATH; `make tools` installs it (Debian package kcat)"
    arguments = [kcat.encode(), b"-P", b"-b", bootstrap.encode(), b"-t", topic.encode()]
    for name, header_value in headers:
        arguments += [b"-H", name + b"=" + header_value]
    subprocess.run(arguments, input=value, check=True, timeout=30)


def test_the_consumer_dead_letters_it_as_malformed_and_goes_on(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str],
        running: Callable[[RetryingConsumer], Running]) -> None:
    topic, group = new_topic(), unique_name("names")
    producer = input_producer(bootstrap)
    kafka.produce_confirmed(producer, [kafka.OutRecord(topic, b"before")])
    kcat_produce(bootstrap, topic, b"unreadable", [(b"fine", b"1"), (BAD_NAME, b"v")])
    kafka.produce_confirmed(producer, [kafka.OutRecord(topic, b"after", None, [("x", b"1")])])
    seen = Handled()

    def handler(record: Record) -> None:
        seen.add(record)

    run = running(RetryingConsumer(bootstrap, topic, group,
                                   RetryPolicy(backoff=Backoff.sequence("1s")), handler,
                                   config=FAST_GROUP))
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 3}, 30, "offset 3 committed")
    run.stop()
    assert seen.values() == [b"before", b"after"]
    [dead] = read_all(bootstrap, f"{topic}.{group}.dlt", expect=1)
    assert dead.value == b"unreadable"
    assert dead.header(h.REASON) == "malformed"
    assert "bad\\xffname" in (dead.header(h.ERROR_MESSAGE) or "")
    assert run.consumer.metrics.value("redrive_dead_lettered_total", topic=topic,
                                      reason="malformed") == 1


def test_the_delay_service_dead_letters_it_as_malformed_and_goes_on(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[..., str]) -> None:
    target = new_topic(1)
    tiers = Tiers.of(TEST_TIERS, prefix=f"{unique_name('delay')}.delay")
    service = DelayService(bootstrap, tiers, instance_id=unique_name("i"), partitions=1,
                           group_id=unique_name("g"))
    reader = Reader(bootstrap, target)
    with running(service):
        tier, due = tiers.topics[0], str(now_ms()).encode()
        kcat_produce(bootstrap, tier, b"unreadable",
                     [(h.TARGET.encode(), target.encode()), (h.DUE.encode(), due),
                      (BAD_NAME, b"v")])
        produce_input(bootstrap, [kafka.OutRecord(
            tier, b"good", None, [(h.TARGET, target.encode()), (h.DUE, due)])])
        arrivals = reader.read(1, timeout_s=15)
        dead = Reader(bootstrap, tiers.dead_letter).read(1, timeout_s=15)
    reader.close()
    assert [a.value for a in arrivals] == [b"good"]
    assert [(d.value, d.header(h.REASON)) for d in dead] == [(b"unreadable", "malformed")]
    assert "not UTF-8" in (dead[0].header(h.ERROR_MESSAGE) or "")
