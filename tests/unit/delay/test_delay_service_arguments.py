"""A DelayService refuses bad arguments at construction, naming the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from redrive.delay import DelayService
from redrive.errors import InvalidArgument


@pytest.mark.parametrize(("field", "value"), [
    ("timeout_s", 0), ("timeout_s", -5), ("timeout_s", "30"), ("partitions", 0),
    ("max_batch", 0), ("instance_id", ""), ("timeout_s", float("inf")), ("partitions", "6"),
    ("instance_id", 7), ("tiers", "1s,1m"), ("transactional", "no"), ("create_topics", "no"),
    ("consumer_overrides", [("fetch.min.bytes", 1)]), ("producer_overrides", "linger.ms=5"),
    ("group_id", ""), ("group_id", None)])
def test_a_bad_argument_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        DelayService("127.0.0.1:9", **{field: value})
    assert field in str(caught.value) and repr(value) in str(caught.value)
