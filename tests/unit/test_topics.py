import pytest

from redrive import topics
from redrive.errors import InvalidArgument
from redrive.policy import Backoff, RetryPolicy


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
])
def test_illegal_names_are_rejected(topic: str, group: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        topics.plan(RetryPolicy(), topic, group)
    assert caught.value.field == field


def test_partition_kept_only_when_retry_topic_has_it() -> None:
    assert topics.partition_for(3, 4) == 3
    assert topics.partition_for(3, 3) is None
    assert topics.partition_for(None, 3) is None
