"""The redrive-kafka source on a Spark standalone cluster: executors launched by a worker read,
in a batch query and in each form of the pipeline (whose streams read the same way).

The session lives in cluster_runner.py's process (see conftest.py); its executors run this
interpreter and import redrive from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from redrive import headers as h
from redrive import kafka

from ..records import produce_input
from .conftest import query_checkpoint
from .test_pipeline import read_all
from .test_spark_source import produce

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 300


def test_the_session_runs_on_the_cluster(cluster_spark: Any) -> None:
    cluster = cluster_spark.cluster
    assert cluster_spark.master == cluster.master_url
    state = cluster.master_state()
    assert state["aliveworkers"] == 1
    assert [app["id"] for app in state["activeapps"]] == [cluster_spark.app_id]
    assert state["workers"][0]["coresused"] == 1


def test_batch_read(cluster_spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, RECORDS)
    result = cluster_spark.run("batch", bootstrap=bootstrap, topic=topic)
    assert (result["count"], result["rows"], result["distinct"]) == (RECORDS,) * 3
    assert result["values"] == sorted(f"v{i}" for i in range(RECORDS))
    # The reads ran in the worker's executor: one executor dir for the application.
    executors = list((cluster_spark.cluster.worker_dir / cluster_spark.app_id).iterdir())
    assert len(executors) == 1


@pytest.mark.parametrize("form", ["transform", "function"])
def test_a_pipeline_retries_and_dead_letters_on_the_cluster(
        cluster_spark: Any, bootstrap: str, new_topic: Any, unique_name: Any, tmp_path: Path,
        form: str) -> None:
    topic = new_topic(2)
    group = unique_name(f"cluster-{form}")
    kinds = ["ok"] * 40 + ["bad"] * 3 + ["flaky"] * 5
    sent = {f"k{i}": kind for i, kind in enumerate(kinds)}
    produce_input(bootstrap, [
        kafka.OutRecord(topic, f"{kind}:{key}".encode(), key.encode())
        for key, kind in sent.items()])
    result = cluster_spark.run("pipeline", timeout_s=300, bootstrap=bootstrap, topic=topic,
                               group=group, form=form, sink=str(tmp_path / "out"),
                               checkpoint=str(tmp_path / "cp"), expected=len(kinds))
    # every success once, the flaky ones after one retry; lost 0, none early
    assert result["keys"] == sorted(k for k, kind in sent.items() if kind != "bad")
    assert result["attempts"] == [0] * 40 + [1] * 5
    assert result["succeeded_by_retries"] == {"0": 40, "1": 5}
    assert result["dead_lettered_by_reason"] == {"not-retryable": 3}
    assert result["early"] == 0
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(m.key().decode() for m in dead) == sorted(
        k for k, kind in sent.items() if kind == "bad")
    # the function's class is named with its module, the transform's as its column says
    assert {h.last(kafka.message_headers(m), h.ERROR_TYPE) for m in dead} == {
        b"ParseError" if form == "transform" else b"pipeline_jobs.ParseError"}


def test_a_task_spark_runs_again_copies_only_what_its_earlier_attempt_did_not(
        cluster_spark: Any, bootstrap: str, new_topic: Any, unique_name: Any,
        tmp_path: Path) -> None:
    topic = new_topic(1)
    group = unique_name("cluster-task-retry")
    dead_letters = f"{topic}.{group}.dlt"
    kafka.create_topics(kafka.admin(bootstrap), {dead_letters: 1})
    produce_input(bootstrap, [
        *(kafka.OutRecord(topic, f"bad:{i}".encode(), f"k{i}".encode()) for i in range(3)),
        kafka.OutRecord(topic, b"bad:" + b"x" * 5000, b"too-large")])
    result = cluster_spark.run("route_with_task_retries", bootstrap=bootstrap, topic=topic,
                               group=group, checkpoint=query_checkpoint(tmp_path / "cp"))
    # Spark ran the task four times; each attempt failed on the record too large to copy
    assert "RecordTooLarge" in result["raised"]
    assert result["failed_tasks"] == 4
    # the first attempt's copies, and no attempt's again
    dead = read_all(bootstrap, dead_letters)
    assert sorted(m.key() for m in dead) == [b"k0", b"k1", b"k2"]
    assert {h.last(kafka.message_headers(m), h.ATTEMPT) for m in dead} == {b"1"}
