"""The control topic on noida-db: a Spark pipeline's stops stand until a resume written after
them covers them, or their cool-off ends; other groups' records and unreadable ones change
nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from redrive import kafka
from redrive.clock import now_ms
from redrive.control import (
    CONTROL_TOPIC,
    Resume,
    Stop,
    request_resume,
    standing_stops,
    write_stops,
)
from redrive.errors import InvalidArgument

pytestmark = pytest.mark.integration


def write(bootstrap: str, group: str, value: bytes) -> None:
    kafka.create_topics(kafka.admin(bootstrap), {CONTROL_TOPIC: 1})
    kafka.produce_confirmed(kafka.producer(bootstrap),
                            [kafka.OutRecord(CONTROL_TOPIC, value, group.encode())])


def test_stops_stand_until_a_later_resume_covers_them(bootstrap: str, unique_name: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    group, other = unique_name("ctl"), unique_name("ctl-other")
    topic, retry = "orders", f"orders.{group}.retry.5s"
    with pytest.raises(InvalidArgument, match=rf"group='{group}': no consumer .* no Spark"):
        request_resume(bootstrap, Resume(group))
    write(bootstrap, group, Resume(group).encode())  # written before the stop: releases nothing
    write_stops(bootstrap, [Stop(group, topic, 0, 5, topic, now_ms(), None, "more than 1"),
                            Stop(group, retry, 1, 7, topic, now_ms())])
    write(bootstrap, other, Resume(other).encode())  # another group's
    write(bootstrap, group, b"{not json")
    with caplog.at_level(logging.WARNING, logger="redrive.control"):
        standing = standing_stops(bootstrap, group)
    assert [(s.topic, s.partition, s.offset) for s in standing.active] == \
        [(topic, 0, 5), (retry, 1, 7)]
    assert standing.released == {}
    assert "ignored control record" in caplog.text and "not JSON" in caplog.text
    assert standing_stops(bootstrap, other).active == ()

    # Another partition of the topic, then the main topic named for a retry topic's partition.
    request_resume(bootstrap, Resume(group, topic, 3))
    assert len(standing_stops(bootstrap, group).active) == 2
    request_resume(bootstrap, Resume(group, topic))  # the main topic covers its retry topics
    standing = standing_stops(bootstrap, group)
    assert standing.active == ()
    assert standing.released == {(topic, 0): 5, (retry, 1): 7}


def test_a_cool_off_releases_a_stop_by_itself(bootstrap: str, unique_name: Any) -> None:
    group = unique_name("ctl-cool")
    at = now_ms()
    write_stops(bootstrap, [Stop(group, "t", 0, 3, "t", at - 2_000, 1_000),
                            Stop(group, "t", 1, 4, "t", at, 60_000)])
    standing = standing_stops(bootstrap, group)
    assert [s.partition for s in standing.active] == [1]
    assert standing.released == {("t", 0): 3}
    later = standing_stops(bootstrap, group, at_ms=at + 60_000)
    assert later.active == () and later.released == {("t", 0): 3, ("t", 1): 4}
