"""The main-topic batch size that keeps a batch near the slice while retry topics are read."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from redrive.consumer.pace import FIRST, MainBatchSize


def test_a_slow_handler_gets_batches_of_about_the_slice_and_a_fast_one_whole_batches() -> None:
    size = MainBatchSize(500, slice_s=0.1)
    assert size.size() == FIRST  # nothing timed yet
    size.took(32, 32 * 0.005)  # 5 ms a record
    assert size.size() == 20
    fast = MainBatchSize(500, slice_s=0.1)
    fast.took(32, 32 * 20e-6)  # 20 us a record: 5,000 would fit
    assert fast.size() == 500


def test_a_handler_that_slows_cuts_the_next_batch_at_once_and_grows_it_back_gradually() -> None:
    size = MainBatchSize(500, slice_s=0.1)
    size.took(100, 100 * 0.001)
    assert size.size() == 100
    size.took(100, 100 * 0.01)  # a service slowed tenfold
    assert size.size() == 10
    sizes = []
    for _ in range(4):
        size.took(10, 10 * 0.001)
        sizes.append(size.size())
    assert sizes == sorted(sizes) and 10 < sizes[0] < sizes[-1] < 100


@given(st.integers(1, 10_000), st.lists(st.tuples(st.integers(0, 1_000),
                                                  st.floats(0, 100, allow_nan=False)),
                                        max_size=20))
def test_the_size_stays_between_one_and_the_batch_size(
        most: int, batches: list[tuple[int, float]]) -> None:
    size = MainBatchSize(most)
    for records, seconds in batches:
        size.took(records, seconds)
        assert 1 <= size.size() <= most


def test_a_batch_timed_at_zero_gives_whole_batches() -> None:
    size = MainBatchSize(500)
    size.took(10, 0.0)
    assert size.size() == 500


def test_without_retry_partitions_a_poll_takes_whole_batches_and_timed_batches_count() -> None:
    size = MainBatchSize(500, slice_s=0.1)
    assert size.size(reading_retries=False) == 500
    handled: list[list[int]] = []

    def slow(batch: list[int]) -> None:
        handled.append(batch)
        time.sleep(0.05)  # 5 ms a record

    size.timed(slow, list(range(10)))
    assert handled == [list(range(10))]
    assert 1 <= size.size() <= 20  # at most 0.1 s of 5 ms records
    assert size.size(reading_retries=False) == 500
