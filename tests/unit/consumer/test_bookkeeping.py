"""The consumer's pure bookkeeping: in-place budgets, batch offsets, argument checks."""

from __future__ import annotations

import functools
import math

import pytest

from redrive.consumer import RetryingConsumer
from redrive.consumer.batch import Batch, Copy
from redrive.consumer.in_place import InPlaceRetries
from redrive.errors import InvalidArgument
from redrive.policy import RetryPolicy
from redrive.routing import DeadLetter

A, B = ("orders", 0), ("orders.g.retry.5s", 1)


def test_in_place_budget_counts_per_record_and_resets_on_a_new_offset() -> None:
    retries = InPlaceRetries()
    assert retries.fail(A, 10, budget=2) == 1
    assert retries.fail(A, 10, budget=2) == 2
    assert retries.fail(A, 10, budget=2) is None  # spent: route it
    retries.clear(A)
    assert retries.fail(A, 10, budget=2) == 1
    assert retries.fail(A, 11, budget=2) == 1  # another record heads the partition now
    retries.drop([A])
    assert retries.failures(A, 11) == 0 and len(retries) == 0


def test_batch_commits_the_next_offset_after_the_last_finished_record() -> None:
    batch = Batch()
    batch.finish(A, 5)
    batch.route(Copy(None, DeadLetter(None, [], "exhausted", 3, 0), "orders", A, 6))
    batch.stop(B)  # held at its first record: nothing of it is committed
    assert batch.commit_offsets() == {A: 7}
    assert batch.stopped == {B}
    assert batch.out_records == []  # no dead-letter topic: nothing to produce


@pytest.mark.parametrize(("field", "kwargs", "value"), [
    ("topics", {"topics": []}, []),
    ("topics", {"topics": "bad topic"}, "bad topic"),
    ("group", {"group": ""}, ""),
    ("policy", {"policy": "3 attempts"}, "3 attempts"),
    ("handler", {"handler": 42}, 42),
    ("batch_size", {"batch_size": 0}, 0),
    ("poll_timeout_s", {"poll_timeout_s": -1}, -1),
    ("metrics_port", {"metrics_port": 70000}, 70000),
    ("timeout_s", {"timeout_s": math.inf}, math.inf),
    ("connection", {"connection": ["localhost:9"]}, ["localhost:9"]),
    ("connection", {"connection": None}, None),
    ("config", {"config": [("linger.ms", 5)]}, [("linger.ms", 5)]),
    ("producer_config", {"producer_config": "linger.ms=5"}, "linger.ms=5"),
    ("metrics", {"metrics": "prometheus"}, "prometheus"),
    ("transactional_id", {"transactional_id": ""}, ""),
    ("transactional_id", {"transactional_id": 7}, 7),
    ("create_topics", {"create_topics": "no"}, "no"),
])
def test_bad_arguments_name_the_field_and_value(field: str, kwargs: dict[str, object],
                                                value: object) -> None:
    args: dict[str, object] = {"connection": "localhost:9", "topics": "orders", "group": "g",
                               "policy": RetryPolicy(), "handler": print, **kwargs}
    with pytest.raises(InvalidArgument) as caught:
        RetryingConsumer(**args)  # type: ignore[arg-type]
    assert caught.value.field == field and caught.value.value == value
    assert f"invalid {field}={value!r}" in str(caught.value)


async def handle_async(record: object) -> None:
    pass


class AsyncHandler:
    async def __call__(self, record: object) -> None:
        pass


@pytest.mark.parametrize("handler", [handle_async, AsyncHandler(), functools.partial(handle_async)])
def test_an_async_handler_is_refused_for_it_would_never_run(handler: object) -> None:
    with pytest.raises(InvalidArgument, match=r"invalid handler=.*is an async function, which "
                       r"redrive would call without awaiting"):
        RetryingConsumer("localhost:9", "orders", "g", RetryPolicy(),
                         handler)  # type: ignore[arg-type]
