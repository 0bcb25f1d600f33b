"""How a RetryPipeline run ends: stop() on a query kept busy by a backlog returns once the batch
in hand is done (a batch cut after it runs again from the checkpoint, written once), and an error
leaving run() stops the query rather than leave it running."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from redrive.spark import RetryPipeline

from .test_pipeline import FORMS, POLICY, produce

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_busy_pipeline_stops_after_the_batch_in_hand_and_the_next_run_writes_the_rest_once(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """Each batch outlasts the trigger interval, so the next begins at once and the query is
    never seen idle: stop() waited two minutes for an idle moment, then cut a batch anyway."""
    topic, group = new_topic(), unique_name("busy")
    produce(bootstrap, topic, ["ok"] * 60)
    batches: dict[int, list[str]] = {}  # by batch id: a batch run again replaces itself

    def slow_sink(frame: Any, batch_id: int) -> None:
        keys = [row["key"] for row in frame.collect()]
        time.sleep(1.5)
        batches[batch_id] = keys

    checkpoint = str(tmp_path / "cp")
    busy = RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS["frame"],
                         sink=slow_sink, checkpoint=checkpoint,
                         trigger_interval="200 milliseconds", max_offsets_per_trigger=2)
    asked: list[float] = []

    def stop_after_two_batches() -> None:
        while len(batches) < 2:
            time.sleep(0.05)
        asked.append(time.monotonic())
        busy.stop()

    threading.Thread(target=stop_after_two_batches, daemon=True).start()
    busy.run(timeout_s=240)
    assert asked, "run() ended before stop() was called"
    assert time.monotonic() - asked[0] < 15
    assert sum(map(len, batches.values())) < 60  # the backlog was not read out meanwhile

    def sink(frame: Any, batch_id: int) -> None:
        batches[batch_id] = [row["key"] for row in frame.collect()]

    RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS["frame"], sink=sink,
                  checkpoint=checkpoint, available_now=True).run(timeout_s=120)
    keys = [key for found in batches.values() for key in found]
    assert sorted(keys) == sorted(f"k{i}" for i in range(60))


def test_an_error_from_a_batch_hook_stops_the_query(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path) -> None:
    """On Spark Connect the query runs in the server: left running, it went on reading,
    writing and copying with no one to stop it."""
    topic, group = new_topic(), unique_name("hook")
    produce(bootstrap, topic, ["ok"] * 20)

    def hook(batch_id: int, stats: Any) -> None:
        raise RuntimeError("the hook failed")

    pipeline = RetryPipeline(spark, bootstrap, topic, group, POLICY, **FORMS["frame"],
                             sink=lambda frame, batch_id: None, checkpoint=str(tmp_path / "cp"),
                             trigger_interval="200 milliseconds", max_offsets_per_trigger=5,
                             on_batch=hook)
    with pytest.raises(RuntimeError, match="the hook failed"):
        pipeline.run(timeout_s=120)
    assert [q for q in spark.streams.active if q.name == f"redrive-{group}"] == []
