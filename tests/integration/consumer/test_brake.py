"""The dead-letter brake on a broker: a run of dead letters stops the partition at the record that
would pass the limit, nothing is committed past it, `redrive resume` lets it go on; a cool-off
lets it go on by itself."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from redrive.cli import cli
from redrive.consumer import RetryingConsumer
from redrive.policy import DeadLetterLimit, RetryPolicy
from redrive.record import Record

from .conftest import FAST_GROUP, Running, committed, produce, read_all, topic_size, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Poison(ValueError):
    pass


def handler(calls: Counter[int]) -> Callable[[Record], None]:
    def handle(record: Record) -> None:
        calls[record.offset] += 1
        if (record.value or b"").startswith(b"poison"):
            raise Poison(f"cannot parse {record.value!r}")
    return handle


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
def test_the_brake_stops_at_the_record_that_passes_and_resume_lets_it_go_on(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        transactional: bool) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("brake")
    dlt = f"{topic}.{group}.dlt"
    values = [b"ok"] * 3 + [b"poison"] * 10 + [b"ok"] * 2  # offsets 0-2, 3-12, 13-14
    produce(bootstrap, topic, values)
    calls: Counter[int] = Counter()
    consumer = RetryingConsumer(
        bootstrap, topic, group,
        RetryPolicy(not_retryable=Poison, dead_letter_limit=DeadLetterLimit(consecutive=5)),
        handler(calls), config=FAST_GROUP, transactional=transactional, poll_timeout_s=0.2)
    running(consumer)
    metrics = consumer.metrics
    wait_until(lambda: metrics.value("redrive_braked_partitions") == 1, 30, "the brake")
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 8}, 10, "the commit up to it")
    time.sleep(1.0)  # held: nothing more is handled, dead-lettered or committed
    assert len(read_all(bootstrap, dlt, expect=5)) == 5  # not topic_size: it counts markers
    assert committed(bootstrap, group, topic) == {0: 8}
    assert sorted(calls) == list(range(9)) and calls[8] == 1
    assert metrics.value("redrive_brake_trips_total", topic=topic) == 1
    assert metrics.value("redrive_paused_partitions") == 1

    # A mistyped group is named, not "requested" to no effect.
    typo = CliRunner().invoke(cli, ["resume", "-b", bootstrap, "--group", group + "x"])
    assert typo.exit_code == 2
    assert typo.stderr.strip() == (f"error: invalid group='{group}x': no consumer of this group "
                                   "is running and no Spark pipeline of it is stopped, so no "
                                   "partition of it is braked")
    result = CliRunner().invoke(cli, ["resume", "-b", bootstrap, "--group", group, "--topic",
                                      topic, "--partition", "0", "--actor", "oncall@test"])
    assert result.exit_code == 0, result.output
    assert f"resume of {topic}[0] requested for group {group}" in result.output
    # Counted afresh: the five dead letters left pass, then the last two records succeed.
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 15}, 30, "the rest")
    assert metrics.value("redrive_braked_partitions") == 0
    assert metrics.value("redrive_paused_partitions") == 0
    dead = read_all(bootstrap, dlt, expect=10)
    assert sorted(int(r.header("redrive-original-offset") or -1) for r in dead) == \
        list(range(3, 13))
    assert calls[8] == 2 and all(calls[o] == 1 for o in range(15) if o != 8)
    assert metrics.value("redrive_processed_total", topic=topic) == 5


def test_a_cool_off_lets_the_partition_go_on_by_itself(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("cool")
    produce(bootstrap, topic, [b"poison"] * 3 + [b"ok"])
    calls: Counter[int] = Counter()
    limit = DeadLetterLimit(consecutive=1, cool_off="700ms")
    consumer = RetryingConsumer(bootstrap, topic, group,
                                RetryPolicy(not_retryable=Poison, dead_letter_limit=limit),
                                handler(calls), config=FAST_GROUP, poll_timeout_s=0.2)
    running(consumer)
    started = time.monotonic()
    wait_until(lambda: committed(bootstrap, group, topic) == {0: 4}, 30, "every record")
    took = time.monotonic() - started
    # Offsets 1 and 2 each trip it once and wait out the cool-off.
    assert consumer.metrics.value("redrive_brake_trips_total", topic=topic) == 2
    assert took >= 1.4
    assert topic_size(bootstrap, f"{topic}.{group}.dlt") == 3
    assert calls == Counter({0: 1, 1: 2, 2: 2, 3: 1})
