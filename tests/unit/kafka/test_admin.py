"""Topic administration against a broker that does not answer: one error naming the address;
and the errors a cluster answers with, which the admin client's futures keep."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from redrive import kafka
from redrive.errors import BrokerUnavailable


def test_creating_a_topic_without_a_broker_names_the_address_and_the_topic() -> None:
    admin = kafka.admin({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"bootstrap.servers='127.0.0.1:1'.*"
                                                r"creating topic 'orders' got no answer in 1 s"):
        kafka.create_topics(admin, {"orders": 3}, timeout_s=1)
    assert time.monotonic() - started < 5


class _Failed:
    def __init__(self, code: int) -> None:
        self.code = code

    def result(self, timeout: float) -> None:
        raise KafkaException(KafkaError(self.code))


class _Admin:
    """Answers DescribeGroups with an error, as a cluster does."""

    def __init__(self, code: int) -> None:
        self.code = code

    def describe_consumer_groups(self, groups: list[str],
                                 request_timeout: float) -> dict[str, _Failed]:
        return {group: _Failed(self.code) for group in groups}


def test_a_group_the_client_may_not_describe_is_not_taken_for_an_empty_one() -> None:
    # An ACL without Describe on the group must not block `redrive resume`.
    assert kafka.group_members(_Admin(KafkaError.GROUP_AUTHORIZATION_FAILED), "g") is None
    assert kafka.group_members(_Admin(KafkaError.GROUP_ID_NOT_FOUND), "g") == 0
    with pytest.raises(BrokerUnavailable):
        kafka.group_members(_Admin(KafkaError._TRANSPORT), "g")


class _Refusing:
    """Answers CreateTopics and DescribeConfigs with one error for each, as a cluster does."""

    def __init__(self, code: int) -> None:
        self.code = code

    def _failed(self) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_exception(KafkaException(KafkaError(self.code)))
        return future

    def create_topics(self, new: list[Any], **_: float) -> dict[str, Future[Any]]:
        return {topic.topic: self._failed() for topic in new}

    def describe_configs(self, resources: list[Any], **_: float) -> dict[Any, Future[Any]]:
        return {resource: self._failed() for resource in resources}


class _Held:
    """Stands for what a caller holds while it asks, a client reconnecting to its brokers."""


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("ask, code", [
    (lambda admin: kafka.create_topics(admin, {"orders": 1}), KafkaError.TOPIC_ALREADY_EXISTS),
    (lambda admin: kafka.record_limits(admin, ["orders"]),
     KafkaError.TOPIC_AUTHORIZATION_FAILED),
], ids=["create an existing topic", "describe a topic not described to this client"])
def test_an_error_taken_in_stride_keeps_nothing_of_the_caller_alive(
        ask: Callable[[Any], Any], code: int, no_collector: None) -> None:
    # A dev broker's restart created its ready topic again, then made a producer: the future's
    # error kept that frame, the producer with it, reconnecting for the rest of a test run.
    def caller() -> weakref.ref[_Held]:
        held = _Held()
        ask(_Refusing(code))
        return weakref.ref(held)

    assert caller()() is None
