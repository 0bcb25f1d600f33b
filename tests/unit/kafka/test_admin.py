"""Topic administration against a broker that does not answer: one error naming the address."""

from __future__ import annotations

import time

import pytest

from redrive import kafka
from redrive.errors import BrokerUnavailable


def test_creating_a_topic_without_a_broker_names_the_address_and_the_topic() -> None:
    admin = kafka.admin({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"bootstrap.servers='127.0.0.1:1'.*"
                                                r"creating topic 'orders' got no answer in 1 s"):
        kafka.create_topics(admin, {"orders": 3}, timeout_s=1)
    assert time.monotonic() - started < 5
