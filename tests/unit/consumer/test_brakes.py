"""The dead-letter brake: the limit's validation, the sliding window against a plain model of it
(hypothesis), and Brake's holds and releases on a recording consumer (the integration test in
tests/integration/consumer/test_brake.py runs it on a broker)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.clock import now_ms
from redrive.consumer.brakes import UNTIL_RESUMED_MS, Brake
from redrive.control import Resume
from redrive.errors import InvalidArgument, InvalidPolicy
from redrive.kafka.holds import Holds
from redrive.metrics import Metrics
from redrive.policy import DeadLetterLimit, RetryPolicy
from redrive.policy.brake import Window
from redrive.record import NO_HISTORY, Record, new_record

from ..kafka.test_holds import Calls

A, B = ("orders", 0), ("orders.g.retry.5s", 1)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({}, "dead_letter_limit"),
    ({"ratio": 1.0}, "dead_letter_limit.ratio"),
    ({"ratio": -0.1}, "dead_letter_limit.ratio"),
    ({"ratio": "half"}, "dead_letter_limit.ratio"),
    ({"ratio": 0.5, "window": 0}, "dead_letter_limit.window"),
    ({"consecutive": -1}, "dead_letter_limit.consecutive"),
    ({"consecutive": True}, "dead_letter_limit.consecutive"),
    ({"consecutive": 3, "cool_off": "soon"}, "dead_letter_limit.cool_off"),
    ({"consecutive": 3, "cool_off": 0}, "dead_letter_limit.cool_off"),
])
def test_an_invalid_limit_names_its_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        DeadLetterLimit(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_policy_takes_only_a_limit_and_a_cool_off_is_kept_in_ms() -> None:
    with pytest.raises(InvalidPolicy, match="dead_letter_limit"):
        RetryPolicy(dead_letter_limit=100)  # type: ignore[arg-type]
    limit = DeadLetterLimit(ratio=0.5, window=10, consecutive=3, cool_off="2m")
    assert limit.cool_off_ms == 120_000
    assert limit.describe() == "more than 0.5 of the last 10 or more than 3 in a row"
    assert RetryPolicy(dead_letter_limit=limit).dead_letter_limit is limit


def model_passes(outcomes: list[bool], limit: DeadLetterLimit) -> bool:
    """One more dead letter after `outcomes` (True: a dead letter), judged the slow way."""
    after = [*outcomes, True]
    if limit.consecutive is not None:
        run = 0
        for dead in reversed(after):
            if not dead:
                break
            run += 1
        if run > limit.consecutive:
            return True
    if limit.ratio is None:
        return False
    window = after[-limit.window:]
    return len(window) == limit.window and sum(window) > limit.ratio * len(window)


runs = st.lists(st.tuples(st.integers(1, 7), st.booleans()), max_size=20)


@given(limit=st.one_of(
    st.builds(DeadLetterLimit, ratio=st.floats(0, 0.99), window=st.integers(1, 12),
              consecutive=st.one_of(st.none(), st.integers(0, 6))),
    st.builds(DeadLetterLimit, consecutive=st.integers(0, 6))), runs=runs)
def test_the_window_judges_as_a_record_by_record_model(limit: DeadLetterLimit,
                                                       runs: list[tuple[int, bool]]) -> None:
    window = Window(limit.window)
    outcomes: list[bool] = []
    for count, dead in runs:
        window.add(count, dead)
        outcomes += [dead] * count
        kept = outcomes[-limit.window:]
        assert (window.total, window.dead) == (len(kept), sum(kept))
        assert window.passes(limit) == model_passes(outcomes, limit)


class Watch:
    """Requests at offsets from `written` on, as the control topic numbers them."""

    def __init__(self) -> None:
        self.requests: list[Resume] = []
        self.written = 0
        self.closed = False

    def send(self, *requests: Resume) -> None:
        self.requests += requests

    def end(self) -> int:
        return self.written + len(self.requests)

    def poll(self) -> list[tuple[int, Resume]]:
        found = list(enumerate(self.requests, self.written))
        self.written += len(self.requests)
        self.requests = []
        return found

    def close(self) -> None:
        self.closed = True


def record(tp: tuple[str, int], offset: int) -> Record:
    made: Record = new_record(tp[0], tp[1], offset, 1_000, None, b"v", [], NO_HISTORY)
    return made


def test_brake_holds_the_partition_at_the_dead_letter_that_passes_and_resume_releases_it(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics, watch, made = Metrics("consumer", "g"), Watch(), []

    def new_watch() -> Watch:
        made.append(1)
        return watch

    brake = Brake(DeadLetterLimit(consecutive=2), "g", metrics, new_watch,  # type: ignore[arg-type]
                  "kafka-1:9092,kafka-2:9092")
    holds, consumer = Holds(), Calls()
    brake.succeeded(A, 5)
    assert not brake.stops(consumer, holds, A, record(A, 5), "orders")
    assert not brake.stops(consumer, holds, A, record(A, 6), "orders")
    assert not made and not consumer.made  # no watch until a trip
    assert brake.stops(consumer, holds, A, record(A, 7), "orders")
    assert made == [1] and brake.stopped == {A: "orders"} and A in holds
    # The warning's command can be pasted as it is.
    assert ("redrive resume -b kafka-1:9092,kafka-2:9092 --group g --topic orders --partition 0"
            in caplog.text)
    assert consumer.made == [("pause", [("orders", 0, 7)]), ("seek", [("orders", 0, 7)])]
    assert holds.wait_s(0, 0.5) == 0.5  # held until resumed: the poll wait is unchanged
    assert holds.release_due(consumer, UNTIL_RESUMED_MS - 1) == []
    assert metrics.value("redrive_braked_partitions") == 1
    assert metrics.value("redrive_brake_trips_total", topic="orders") == 1

    watch.send(Resume("g", "orders", 1), Resume("g", "other"))
    assert brake.poll_resumes(consumer, holds) == [] and A in holds
    watch.send(Resume("g", "orders", 0, actor="ana"))
    assert brake.poll_resumes(consumer, holds) == [A]
    assert A not in holds and not brake.stopped
    assert metrics.value("redrive_braked_partitions") == 0
    # Counted afresh: two more dead letters pass before the next stop.
    assert not brake.stops(consumer, holds, A, record(A, 7), "orders")
    brake.close()
    assert watch.closed


def test_a_cool_off_releases_the_stop_and_a_success_ends_a_run_of_dead_letters() -> None:
    brake = Brake(DeadLetterLimit(consecutive=1, cool_off="1s"), "g", Metrics("consumer", "g"),
                  Watch, "broker:9092")  # type: ignore[arg-type]
    holds, consumer = Holds(), Calls()
    assert not brake.stops(consumer, holds, B, record(B, 1), "orders")
    brake.succeeded(B)
    assert not brake.stops(consumer, holds, B, record(B, 3), "orders")
    assert brake.stops(consumer, holds, B, record(B, 4), "orders")
    assert holds.release_due(consumer, now_ms() + 900) == []
    released = holds.release_due(consumer, now_ms() + 1_000)
    assert released == [B]
    brake.released(released)
    assert not brake.stopped
    assert not brake.stops(consumer, holds, B, record(B, 4), "orders")


def test_the_warning_says_by_when_a_resume_keeps_retention_from_deleting_the_held_records(
        caplog: pytest.LogCaptureFixture) -> None:
    asked: list[str] = []

    def retention_of(topic: str) -> int | None:
        asked.append(topic)
        return 7 * 24 * 3600 * 1000 if topic == "orders" else None

    brake = Brake(DeadLetterLimit(consecutive=1), "g", Metrics("consumer", "g"), Watch,
                  "broker:9092", retention_of)  # type: ignore[arg-type]
    held = new_record("orders", 0, 7, 1_795_780_000_000, None, b"v", [], NO_HISTORY)
    assert not brake.stops(Calls(), Holds(), A, record(A, 6), "orders")
    assert asked == []  # asked only when it trips
    with caplog.at_level(logging.WARNING, logger="redrive.consumer"):
        assert brake.stops(Calls(), Holds(), A, held, "orders")
    assert asked == ["orders"]
    assert caplog.messages[-1].endswith(
        "--partition 0. orders deletes records after retention.ms=604800000 (7d): resume before "
        "2026-12-04 11:46:40 UTC, when the held record and those behind it start to go "
        "unhandled")
    # A topic that keeps records for ever (or that cannot be described) adds nothing.
    assert not brake.stops(Calls(), Holds(), B, record(B, 1), "orders")
    with caplog.at_level(logging.WARNING, logger="redrive.consumer"):
        assert brake.stops(Calls(), Holds(), B, record(B, 2), "orders")
    assert asked == ["orders", B[0]]
    assert caplog.messages[-1].endswith(f"--topic {B[0]} --partition 1")


def test_a_resume_covers_a_group_a_topic_or_one_partition_and_round_trips() -> None:
    assert Resume("g").covers(B, "orders")
    assert Resume("g", "orders").covers(B, "orders")  # a retry topic of the main topic named
    assert not Resume("g", "orders", 1).covers(B, "orders")  # a partition: of that very topic
    assert Resume("g", "orders.g.retry.5s", 1).covers(B, "orders")
    request = Resume("g", "orders", 3, actor="ana@host", at_ms=5)
    assert Resume.decode(request.encode()) == request
    for bad in (b"{", b'{"action": "stop", "group": "g"}', b'{"action": "resume"}',
                b'{"action": "resume", "group": "g", "colour": 1}'):
        with pytest.raises(InvalidArgument, match="control request"):
            Resume.decode(bad)
    with pytest.raises(InvalidArgument, match="partition"):
        Resume("g", None, 1)


def test_a_request_written_before_a_trip_does_not_release_it() -> None:
    # A resume sent while nothing was stopped (a second operator's paste, one typed after the
    # cool-off ended the stop) released the next stop at once.
    watch = Watch()
    brake = Brake(DeadLetterLimit(consecutive=0), "g", Metrics("consumer", "g"), lambda: watch,
                  "broker:9092")  # type: ignore[arg-type]
    holds, consumer = Holds(), Calls()
    assert brake.stops(consumer, holds, A, record(A, 1), "orders")
    watch.send(Resume("g"))
    assert brake.poll_resumes(consumer, holds) == [A]
    watch.send(Resume("g"))  # nothing is stopped: read only at the next stop
    assert brake.stops(consumer, holds, A, record(A, 2), "orders")
    assert brake.stops(consumer, holds, B, record(B, 7), "orders")
    assert brake.poll_resumes(consumer, holds) == [] and brake.stopped == {A: "orders",
                                                                           B: "orders"}
    watch.send(Resume("g", "orders", 0))
    assert brake.poll_resumes(consumer, holds) == [A] and brake.stopped == {B: "orders"}
    assert B in holds
