import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive import headers as h
from redrive import topics
from redrive.backends import DelayQueue
from redrive.clock import now_ms
from redrive.delay import Tiers
from redrive.errors import InvalidArgument
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Delivery, Origin, Record
from redrive.routing import DeadLetter, Retry
from redrive.store import RetryStore, StoreBackend


def test_seed_sequence_default_plan_is_exact() -> None:
    policy = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m,30m,30m,1h"))
    plan = topics.plan(policy, "orders", "billing")
    assert plan.created_topics == ["orders.billing.retry.5m", "orders.billing.retry.30m",
                                   "orders.billing.retry.1h", "orders.billing.dlt"]
    assert [(t.delay, t.retries) for t in plan.retry_topics] == \
        [("5m", (1, 2)), ("30m", (3, 4, 5)), ("1h", (6,))]
    assert plan.consumed_topics == ["orders", "orders.billing.retry.5m",
                                    "orders.billing.retry.30m", "orders.billing.retry.1h"]


def test_per_attempt_naming() -> None:
    policy = RetryPolicy(backoff=Backoff.fixed("5s"), attempts=4, naming="per-attempt")
    plan = topics.plan(policy, "orders", "enricher")
    assert plan.created_topics == ["orders.enricher.retry.1", "orders.enricher.retry.2",
                                   "orders.enricher.retry.3", "orders.enricher.dlt"]
    assert plan.retry_topic_for(2).delay_ms == 5_000


def test_exponential_plan_is_bounded_by_distinct_delays() -> None:
    policy = RetryPolicy(backoff=Backoff.exponential("1s", 2.0, "10s", jitter=0.2), attempts=20)
    plan = topics.plan(policy, "orders", "g")
    assert [t.delay for t in plan.retry_topics] == ["1s", "2s", "4s", "8s", "10s"]
    assert plan.retry_topic_for(19).name == "orders.g.retry.10s"


def test_no_dead_letter_topic_when_off() -> None:
    plan = topics.plan(RetryPolicy(dead_letter=False), "orders", "g")
    assert plan.dead_letter is None and plan.created_topics == ["orders.g.retry.1s"]


@pytest.mark.parametrize(("topic", "group", "field"), [
    ("orders", "bil ling", "group"), ("", "g", "topic"), ("ord/ers", "g", "topic"),
    ("o" * 240, "group", "retry topic"),
    ("orders\n", "g", "topic"), ("orders", "g\n", "group"), (".", "g", "topic"),
    ("..", "g", "topic"),
])
def test_illegal_names_are_rejected(topic: str, group: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        topics.plan(RetryPolicy(), topic, group)
    assert caught.value.field == field


def test_a_group_too_long_for_the_spark_batch_ledger_is_refused_naming_it() -> None:
    group = "g" * 233  # plan() takes it with a short topic: its names stay within 249
    names = topics.plan(RetryPolicy(), "o", group).created_topics
    assert max(map(len, names)) <= 249
    with pytest.raises(InvalidArgument, match=r"batch ledger topic .* 250 characters") as caught:
        topics.pipeline_ledger_name(group)
    assert caught.value.field == "group"
    assert caught.value.value == group
    assert topics.pipeline_ledger_name("g" * 232) == "redrive.pipeline." + "g" * 232
    with pytest.raises(InvalidArgument, match="group"):
        topics.pipeline_ledger_name("bad group")


def test_partition_kept_only_when_retry_topic_has_it() -> None:
    assert topics.partition_for(3, 4) == 3
    assert topics.partition_for(3, 3) is None
    assert topics.partition_for(None, 3) is None


# Kafka refuses "." and ".." as names.
names = st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1,
                max_size=30).filter(lambda name: name not in (".", ".."))
policies = st.builds(
    lambda delays, per_attempt: RetryPolicy(backoff=Backoff.sequence(delays),
                                            naming="per-attempt" if per_attempt else "per-delay"),
    st.lists(st.integers(1, 10**8), min_size=1, max_size=6).map(
        lambda ms: ",".join(f"{m}ms" for m in ms)),
    st.booleans())


@given(topic=names, group=names, policy=policies)
def test_each_retry_topic_of_a_plan_names_its_topic_and_no_other_topic_does(
        topic: str, group: str, policy: RetryPolicy) -> None:
    plan = topics.plan(policy, topic, group)
    for name in plan.retry_topic_names:
        assert topics.retried_topic(name, group) == topic
    # A main topic reads as a retry topic only if its name holds the group's marker, and then
    # it names what precedes the last one.
    marker = f".{group}.retry."
    assert topics.retried_topic(topic, group) in (
        (None, topic[:topic.rfind(marker)]) if marker in topic else (None,))
    assert topics.retried_topic(f"{topic}.{group}.dlt", group) is None
    assert topics.retried_topic(f"{topic}.{group}.retry.x5s", group) is None


def test_a_copy_from_an_earlier_policys_retry_topic_goes_back_to_its_main_topic() -> None:
    bound = DelayQueue(Tiers.parse("1s,10s")).bind("billing")
    origin = Origin("orders", 2, 40, 1_700_000_000_000)
    for read_from, target in (("orders.billing.retry.5m", "orders"), ("orders", "orders"),
                              ("payments", "payments")):
        record = Record(read_from, 2, 7, 1, b"k", b"v", [],
                        Delivery(attempt=1, group="billing", original=origin))
        decision = Retry("orders.billing.retry.5m", now_ms() + 5_000, [], 2, 2)
        out = bound.failed(record, decision, {"redrive.delay.1s": 1})
        assert out is not None and out.topic == "redrive.delay.1s"
        assert h.last(out.headers, h.TARGET) == target.encode()


@given(due_in_ms=st.integers(-60_000, 60_000), dead=st.booleans())
def test_every_copy_the_delay_queue_makes_goes_to_one_of_its_copy_topics(
        due_in_ms: int, dead: bool) -> None:
    """The Spark ledger looks for a resumed batch's copies in copy_topics: one written
    elsewhere (a retry already due goes straight back to its main topic) would be copied
    again."""
    bound = DelayQueue(Tiers.parse("1s,10s")).bind("billing")
    plans = {"orders": topics.plan(RetryPolicy(), "orders", "billing")}
    record = Record("orders", 0, 5, 1, b"k", b"v", [], Delivery())
    decision = (DeadLetter("orders.billing.dlt", [], "exhausted", 3, 0) if dead
                else Retry("ignored", now_ms() + due_in_ms, [], 1, 0))
    out = bound.failed(record, decision, {})
    assert out is not None and out.topic in bound.copy_topics(plans)


def test_a_retry_topics_wait_is_its_delay_stretched_by_the_jitter() -> None:
    """What the retention check holds each retry topic to (see redrive.retention)."""
    jittered = RetryPolicy(backoff=Backoff.exponential("10s", 3.0, jitter=0.25), attempts=3)
    assert topics.plan(jittered, "o", "g").waits == {"o.g.retry.10s": 12_500,
                                                     "o.g.retry.30s": 37_500}
    steady = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m"))
    assert topics.plan(steady, "o", "g").waits == {"o.g.retry.5m": 300_000,
                                                   "o.g.retry.30m": 1_800_000}


def test_a_store_keeping_references_holds_the_main_topic_to_every_delay_added_up(
        tmp_path: Path) -> None:
    store = RetryStore(str(tmp_path / "store.db"))
    try:
        policy = RetryPolicy(backoff=Backoff.sequence("5m,5m,30m"))
        own = RetryPolicy(backoff=Backoff.exponential("1s", jitter=0.5), attempts=3)
        plans = topics.plans(policy, ["o", "p"], "g")
        by_reference = StoreBackend(store, mode="reference", policies={"p": own}).bind("g")
        # 5m + 5m + 30m; for p its own policy: 1.5s + 3s at the most.
        assert by_reference.waits(plans) == {"o": 2_400_000, "p": 4_500}
        assert StoreBackend(store).bind("g").waits(plans) == {}
    finally:
        store.close()


@pytest.mark.parametrize(("existing", "owner"), [
    # A group name with a dot: its main topic is the one on the cluster.
    ({"orders", "orders.billing.v2.dlt"}, ("orders", "billing.v2")),
    ({"orders.billing", "orders.billing.v2.dlt"}, ("orders.billing", "v2")),
    # Nothing tells them apart: the last dot.
    (set(), ("orders.billing", "v2")),
    ({"orders", "orders.billing"}, ("orders.billing", "v2")),
])
def test_a_dead_letter_topic_is_told_to_its_topic_and_group(
        existing: set[str], owner: tuple[str, str]) -> None:
    assert topics.dead_letter_owner("orders.billing.v2.dlt", existing) == owner


def test_a_topic_not_named_as_a_dead_letter_topic_has_no_owner() -> None:
    for name in ("orders.dlt", "orders.billing", ".dlt", "a..dlt"):
        assert topics.dead_letter_owner(name, {"orders", "a"}) is None, name
