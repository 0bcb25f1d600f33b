"""Topic administration against a broker that does not answer: one error naming the address."""

from __future__ import annotations

import time

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
