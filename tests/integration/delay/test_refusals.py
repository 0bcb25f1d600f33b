"""A copy its target refuses holds only the tier partition it was read from, on noida-db: the
others go on, with and without transactions."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.delay import DelayService, Tiers

from ..consumer.conftest import committed, wait_until
from ..records import produce_input
from .conftest import Reader, now_ms, running

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
def test_a_refused_copy_holds_its_own_tier_partition_and_no_other(
        bootstrap: str, new_topic: NewTopic, tiers: Tiers, unique_name: UniqueName,
        caplog: pytest.LogCaptureFixture, transactional: bool) -> None:
    """In a transaction the refusal aborted every partition's copies and held them all with one
    pause, so they came back together and the refused copy aborted them again: for as long as
    it was refused, nothing of the other partitions was forwarded."""
    small = new_topic(config={"max.message.bytes": "10000"})
    other = new_topic()
    tier = tiers.topics[0]
    kafka.create_topics(kafka.admin(bootstrap), {topic: 2 for topic in tiers.owned_topics})
    now = now_ms()
    due = [(h.DUE, str(now).encode())]
    records = [kafka.OutRecord(tier, b"v" * 20_000, None, [(h.TARGET, small.encode()), *due], 0,
                               now)]
    records += [kafka.OutRecord(tier, b"ok%d" % i, None, [(h.TARGET, other.encode()), *due], 1,
                                now) for i in range(50)]
    produce_input(bootstrap, records)
    caplog.set_level(logging.WARNING, logger="redrive.delay.service")
    group = unique_name("g")
    service = DelayService(bootstrap, tiers, transactional=transactional, partitions=2,
                           group_id=group, instance_id=unique_name("i"))
    with running(service):
        # Counted from the service's commits and metrics: on noida-db a read_committed reader
        # may miss what a producer commits after one of its transactions aborted (README).
        wait_until(lambda: committed(bootstrap, group, tier).get(1) == 50, 10,
                   "partition 1 forwarded and committed")
        assert service.metrics.value("redrive_forwarded_total", topic=other) == 50
        assert committed(bootstrap, group, tier)[0] < 0  # the refused one is still held
        assert service.metrics.value("redrive_paused_partitions") == 1
    tries = [r.getMessage() for r in caplog.records if "is read again" in r.getMessage()]
    assert tries and all(f"{tier}[0] is read again" in message for message in tries), tries
    if not transactional:
        reader = Reader(bootstrap, other)
        counts = collections.Counter(a.value for a in reader.read(50, timeout_s=10))
        reader.close()
        assert set(counts) == {b"ok%d" % i for i in range(50)}
        # Forwarded with the refused one by the first try, and once more by the next.
        assert set(counts.values()) <= {1, 2}
