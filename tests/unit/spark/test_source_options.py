"""The source's options that are checked without a session: a start given per partition for a
topic that redrive.resumeTopics starts where the group stands, offsets and times past 64 bits."""

from __future__ import annotations

import pytest

from redrive.spark.options import SourceOptionError, SourceOptions
from redrive.spark.source import KafkaBatchReader

BASE = {"kafka.bootstrap.servers": "x:1", "subscribe": "orders,orders.g.retry.5s",
        "redrive.group": "g", "redrive.resumeTopics": "orders.g.retry.5s"}


@pytest.mark.parametrize(("option", "value"), [
    ("startingOffsets", '{"orders": {"0": 3}, "orders.g.retry.5s": {"0": 0}}'),
    ("startingOffsetsByTimestamp", '{"orders.g.retry.5s": {"0": 1764236400000}}'),
])
def test_a_start_per_partition_of_a_resumed_topic_is_refused_naming_it(option: str,
                                                                       value: str) -> None:
    # Planning called the partition unknown: "partition orders.g.retry.5s[0] does not exist".
    with pytest.raises(SourceOptionError, match=rf"{option}=.*topic 'orders.g.retry.5s' is in "
                       "redrive.resumeTopics"):
        SourceOptions.parse({**BASE, option: value})


def test_a_start_for_the_other_topics_only_is_taken() -> None:
    parsed = SourceOptions.parse({**BASE, "startingOffsets": '{"orders": {"0": 3}}'})
    assert parsed.starting == {("orders", 0): 3}
    assert parsed.resume_topics == ("orders.g.retry.5s",)


HUGE = 2**63  # one past the largest offset or timestamp Kafka holds


@pytest.mark.parametrize(("option", "value"), [
    ("startingTimestamp", str(HUGE)),
    ("endingTimestamp", str(HUGE)),
    ("startingOffsetsByTimestamp", f'{{"orders": {{"0": {HUGE}}}}}'),
    ("endingOffsetsByTimestamp", f'{{"orders": {{"0": {HUGE}}}}}'),
    ("startingOffsets", f'{{"orders": {{"0": {HUGE}}}}}'),
    ("endingOffsets", f'{{"orders": {{"0": {HUGE}}}}}'),
])
def test_values_past_64_bits_are_refused_naming_the_option(option: str, value: str) -> None:
    # Planning failed with a bare OverflowError (times) or reported data loss (offsets).
    with pytest.raises(SourceOptionError, match=rf"option {option}=.*{HUGE}") as refused:
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribe": "orders",
                             option: value})
    assert refused.value.option == option


def test_the_largest_64_bit_values_are_taken() -> None:
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribe": "orders",
                                  "startingTimestamp": str(HUGE - 1),
                                  "endingOffsets": f'{{"orders": {{"0": {HUGE - 1}}}}}'})
    assert parsed.ending == {("orders", 0): HUGE - 1}


@pytest.mark.parametrize(("option", "value"), [
    ("startingOffsets", '{"orders": {"0": -1, "1": 5}}'),
    ("endingOffsets", '{"orders": {"0": -2, "1": 5}}'),
    ("startingOffsets", "latest"),
])
def test_a_batch_read_from_latest_shows_the_option_as_written(option: str, value: str) -> None:
    # It showed Python's form: {('orders', 0): -1, ('orders', 1): 5}.
    options = SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribe": "orders",
                                   option: value})
    with pytest.raises(SourceOptionError) as refused:
        KafkaBatchReader(options)
    assert refused.value.value == value
    assert f"option {option}='{value}': a batch query cannot" in str(refused.value)
