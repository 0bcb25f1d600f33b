"""The redrive-kafka source on a Spark standalone cluster: executors launched by a worker read.

The session lives in cluster_runner.py's process (see conftest.py); its executors run this
interpreter and import redrive from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


def test_streaming_read(cluster_spark: Any, bootstrap: str, new_topic: Any,
                        tmp_path: Path) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, RECORDS)
    result = cluster_spark.run("stream", bootstrap=bootstrap, topic=topic,
                               checkpoint=str(tmp_path / "ck"), max_offsets_per_trigger=120)
    assert (result["rows"], result["distinct"]) == (RECORDS, RECORDS)
    assert result["batch_sizes"] == [120, 120, 60]
    assert result["values"] == sorted(f"v{i}" for i in range(RECORDS))
