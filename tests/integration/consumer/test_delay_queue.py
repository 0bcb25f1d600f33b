"""retry_backend=DelayQueue: two groups on one topic retry through the real delay service's shared
tiers, each handling its own retries with the attempt count carried on and skipping the other's;
no retry topics of their own; bad input."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from redrive import headers as h
from redrive import kafka
from redrive.backends import DelayQueue
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.delay import DelayService, Tiers
from redrive.errors import InvalidArgument, UnknownTopic
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from ..background import Background, Runnable
from .conftest import FAST_GROUP, Running, produce, read_all, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]

RECORDS = 200


class Flaky(Exception):
    pass


class Handled:
    """What one group's handler saw: each value's calls and successes, and any record early."""

    def __init__(self, group: str, fails_once: Callable[[int], bool],
                 always_fails: Callable[[int], bool]) -> None:
        self.group = group
        self.fails_once = fails_once
        self.always_fails = always_fails
        self.calls: Counter[int] = Counter()
        self.succeeded: Counter[int] = Counter()
        self.attempts: dict[int, list[int]] = {}
        self.problems: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        number = int(record.value or b"")
        delivery = record.delivery
        with self.lock:
            self.calls[number] += 1
            self.attempts.setdefault(number, []).append(delivery.attempt)
            if delivery.group not in (None, self.group):
                self.problems.append(f"{number}: handled {delivery.group}'s copy")
            if delivery.due_ms is not None and now_ms() < delivery.due_ms:
                self.problems.append(f"{number}: handled {delivery.due_ms - now_ms()} ms early")
        if self.always_fails(number):
            raise Flaky(f"{number} never works")
        if self.fails_once(number) and delivery.attempt == 0:
            raise Flaky(f"{number} fails once")
        with self.lock:
            self.succeeded[number] += 1


def test_two_groups_retry_through_the_shared_tiers_and_each_counts_exactly(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start,
        background: Callable[[Runnable], Background]) -> None:
    topic = new_topic(partitions=2)
    tiers = Tiers.of(("100ms", "1s"), prefix=f"{unique_name('dq')}.delay")
    service = DelayService(bootstrap, tiers, instance_id=unique_name("i"), partitions=2,
                           group_id=unique_name("delay"))
    background(service)
    wait_until(lambda: service.metrics.value("redrive_rebalances_total", kind="assign") >= 1,
               30, "the delay service to own its tiers")

    policy = RetryPolicy(backoff=Backoff.fixed("300ms"), attempts=3)
    billing = Handled(unique_name("billing"), lambda n: n % 5 == 0, lambda n: n % 20 == 7)
    shipping = Handled(unique_name("shipping"), lambda n: n % 4 == 1, lambda n: False)
    backend = DelayQueue(tiers)
    runs = [
        running(RetryingConsumer(bootstrap, topic, billing.group, policy, billing,
                                 config=FAST_GROUP, retry_backend=backend)),
        # The copy to the tier and the consumed offsets in one transaction.
        running(RetryingConsumer(bootstrap, topic, shipping.group, policy, shipping,
                                 config=FAST_GROUP, retry_backend=backend, transactional=True)),
    ]
    produce(bootstrap, topic, [str(n).encode() for n in range(RECORDS)])

    always = [n for n in range(RECORDS) if n % 20 == 7]
    once_billing = [n for n in range(RECORDS) if n % 5 == 0]
    once_shipping = [n for n in range(RECORDS) if n % 4 == 1]
    # Each group also reads the other's returning copies, which it skips: the last of them may
    # reach it after the group they are for has handled them.
    wait_until(lambda: sum(billing.succeeded.values()) == RECORDS - len(always)
               and sum(shipping.succeeded.values()) == RECORDS
               and runs[0].total("redrive_dead_lettered_total") == len(always)
               and runs[0].total("redrive_skipped_total") >= len(once_shipping)
               and runs[1].total("redrive_skipped_total") >= len(once_billing) + 2 * len(always),
               60, "every record handled by both groups, and the other's copies skipped")
    for run in runs:
        run.stop()

    assert billing.problems == [] and shipping.problems == []
    # Each group succeeded with every record it could, exactly once.
    assert billing.succeeded == Counter({n: 1 for n in range(RECORDS) if n not in always})
    assert shipping.succeeded == Counter({n: 1 for n in range(RECORDS)})
    # A record failing once came back to its group once, its attempt count carried on.
    assert {n: billing.attempts[n] for n in once_billing} == {n: [0, 1] for n in once_billing}
    assert {n: shipping.attempts[n] for n in once_shipping} == \
        {n: [0, 1] for n in once_shipping}
    assert {n: billing.attempts[n] for n in always} == {n: [0, 1, 2] for n in always}
    assert sum(shipping.calls.values()) == RECORDS + len(once_shipping)
    assert sum(billing.calls.values()) == RECORDS + len(once_billing) + 2 * len(always)
    assert runs[0].total("redrive_skipped_total") == len(once_shipping)
    assert runs[1].total("redrive_skipped_total") == len(once_billing) + 2 * len(always)

    # Every retry went through the tiers and came back to the topic, marked for its group.
    returned = [r for r in read_all(bootstrap, topic, expect=RECORDS + len(once_billing)
                                    + 2 * len(always) + len(once_shipping))
                if r.header(h.GROUP) is not None]
    assert Counter(r.header(h.GROUP) for r in returned) == {
        billing.group: len(once_billing) + 2 * len(always), shipping.group: len(once_shipping)}
    assert all(r.header(h.TARGET) == topic for r in returned)
    assert service.metrics.total("redrive_forwarded_total") >= len(returned)
    dead = read_all(bootstrap, f"{topic}.{billing.group}.dlt", expect=len(always))
    assert sorted(int(r.value or b"") for r in dead) == always
    assert {r.header(h.REASON) for r in dead} == {"exhausted"}
    assert all(r.header(h.TARGET) is None and r.header(h.ATTEMPT) == "3" for r in dead)
    assert {int(r.header(h.ORIGINAL_OFFSET) or -1) >= 0 for r in dead} == {True}
    # No group has a retry topic: the topic count does not grow with groups or delays.
    existing = kafka.topic_partitions(kafka.admin(bootstrap))
    assert sorted(name for name in existing if name.startswith(f"{topic}.")) == sorted(
        [f"{topic}.{billing.group}.dlt", f"{topic}.{shipping.group}.dlt"])


@pytest.mark.parametrize("create_topics", [True, False])
def test_a_missing_tier_fails_at_start_naming_it(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        create_topics: bool) -> None:
    # Without create_topics the tiers went unchecked, and the first failure's copy had nowhere
    # to go.
    topic = new_topic()
    group = unique_name("g")
    if not create_topics:
        new_topic(name=f"{topic}.{group}.dlt")
    tiers = Tiers.of(("100ms",), prefix=f"{unique_name('absent')}.delay")
    consumer = RetryingConsumer(bootstrap, topic, group, RetryPolicy(),
                                lambda record: None, retry_backend=DelayQueue(tiers),
                                create_topics=create_topics)
    with pytest.raises(UnknownTopic, match=rf"{tiers.tiers[0].topic}.*delay tier"):
        consumer.start()
    consumer.close()


def test_tiers_that_are_not_tiers_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"tiers.*redrive\.delay\.Tiers"):
        DelayQueue("1s,10s")  # type: ignore[arg-type]
