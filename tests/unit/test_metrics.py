"""Metrics.handler_took_all, which updates the handler-time histogram a batch of samples at a
time through prometheus_client's histogram internals, must leave exactly what one
handler_took per sample leaves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from redrive.metrics import Metrics

# Bucket bounds themselves, zero, negative and very large times, and anything in between.
SAMPLES = st.lists(st.one_of(
    st.sampled_from([0.0, -1.0, 1e9, 0.0005, 0.001, 0.005, 0.01, 0.1, 1.0, 10.0]),
    st.floats(min_value=-1.0, max_value=1e6, allow_nan=False)), min_size=1, max_size=60)


def exposition(metrics: Metrics) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("redrive_handler_seconds") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@given(SAMPLES, st.integers(min_value=1, max_value=4))
def test_a_batch_of_samples_counts_as_one_sample_at_a_time(samples: list[float],
                                                           batches: int) -> None:
    one, many = Metrics("consumer", "g"), Metrics("consumer", "g")
    for seconds in samples:
        one.handler_took(seconds)
    size = max(1, len(samples) // batches)
    for start in range(0, len(samples), size):
        many.handler_took_all(samples[start:start + size])
    got, expected = exposition(many), exposition(one)
    assert got.keys() == expected.keys() and any("_count{" in k for k in got)
    for name, value in expected.items():
        assert got[name] == value or abs(got[name] - value) <= 1e-9 * max(1.0, abs(value)), name
