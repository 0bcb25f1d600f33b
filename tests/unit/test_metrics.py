"""The histograms redrive keeps itself (prometheus_client has no bulk update) must expose what
prometheus_client's own Histogram exposes, and Metrics.handler_took_all, which counts a batch of
samples at once, exactly what one handler_took per sample leaves."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from redrive.metrics import Metrics

# Bucket bounds themselves, zero, negative and very large times, and anything in between.
TIMES = st.one_of(
    st.sampled_from([0.0, -1.0, 1e9, 0.0005, 0.001, 0.005, 0.01, 0.1, 1.0, 10.0]),
    st.floats(min_value=-1.0, max_value=1e6, allow_nan=False))
SAMPLES = st.lists(TIMES, min_size=1, max_size=60)

HISTOGRAMS = ("redrive_lateness_seconds", "redrive_handler_seconds")


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


def histogram_lines(registry: CollectorRegistry,
                    encode: Callable[[CollectorRegistry], bytes]) -> list[str]:
    lines = []
    for line in encode(registry).decode().splitlines():
        if line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith(HISTOGRAMS):
            # Each side stamps a series with its own clock when it first counts in it.
            lines.append(re.sub(r"^(\w+_created\{.*\}) \S+$", r"\1 <created>", line))
    return lines


@given(st.lists(TIMES, max_size=60), st.lists(TIMES, max_size=60),
       st.integers(min_value=1, max_value=4))
def test_the_histograms_expose_what_prometheus_client_histograms_do(lateness: list[float],
                                                                    handler: list[float],
                                                                    batches: int) -> None:
    metrics, registry = Metrics("consumer", "g"), CollectorRegistry()
    late = Histogram("redrive_lateness_seconds",
                     "How long after its due time a record was processed", ["runtime", "group"],
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                     registry=registry)
    took = Histogram("redrive_handler_seconds", "Time spent in the user's handler",
                     ["runtime", "group"],
                     buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
                     registry=registry)
    for seconds in lateness:
        metrics.late_by(seconds)
        late.labels("consumer", "g").observe(max(0.0, seconds))
    for seconds in handler:
        took.labels("consumer", "g").observe(seconds)
    metrics.handler_took_all([])  # a batch with no record timed: no series yet
    for seconds in handler[:1]:
        metrics.handler_took(seconds)
    size = max(1, len(handler) // batches)
    for start in range(1, len(handler), size):
        metrics.handler_took_all(handler[start:start + size])
    for encode in (generate_latest, generate_openmetrics):
        got, expected = histogram_lines(metrics.registry, encode), histogram_lines(registry, encode)
        assert got == expected
        assert any("_count{" in line for line in got) == bool(lateness or handler)


def test_the_oldest_pending_retry_ages_between_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [10_000]
    monkeypatch.setattr("redrive.metrics.now_ms", lambda: clock[0])
    metrics = Metrics("consumer", "g")
    name = "redrive_oldest_pending_retry_seconds"
    metrics.oldest_pending_retry_since(None)
    assert metrics.value(name) == 0.0
    metrics.oldest_pending_retry_since(8_500)
    assert metrics.value(name) == 1.5
    clock[0] = 12_000  # no update in between: a scrape still sees it wait longer
    assert metrics.value(name) == 3.5
    metrics.oldest_pending_retry_since(13_000)  # not due yet (the store's due time)
    assert metrics.value(name) == 0.0
    metrics.oldest_pending_retry_since(None)
    assert metrics.value(name) == 0.0
    assert f'{name}{{group="g",runtime="consumer"}} 0.0' in generate_latest(
        metrics.registry).decode()
