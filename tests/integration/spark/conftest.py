"""One SparkSession for the whole test session, with the redrive-kafka source registered.

Starting Spark costs 10-20 s and its first job as much again on this class of machine, so every
Spark test shares this session. Two more kinds start only when a test asks for them, once each:

- `connect_spark`: a Spark Connect client session of a local Connect server (redrive.dev.spark).
  It coexists with the classic `spark` because it is built with the Connect builder itself:
  `pyspark.sql.SparkSession.builder.remote(...)` would refuse while a SparkContext is active
  (SESSION_ALREADY_EXIST) and, through `create()`, would set SPARK_CONNECT_MODE_ENABLED for the
  whole process, which turns later classic sessions and functions into Connect ones.
- `cluster_spark`: a classic session on a standalone cluster (master and one worker). One Python
  process holds one SparkContext and `spark` holds the local one, so that session lives in a
  process of its own (cluster_runner.py) started once; tests send it jobs and read counts back.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from redrive import kafka
from redrive.dev.spark import ConnectServer, StandaloneCluster
from redrive.spark import register

RUNNER = Path(__file__).with_name("cluster_runner.py")
RUNNER_READY_TIMEOUT_S = 180.0


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # Workers must run this interpreter, or they start a system Python without pyarrow.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("redrive-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server on local[2] from the pyspark wheel, stopped by its pid."""
    server = ConnectServer(tmp_path_factory.mktemp("spark-connect"), confs={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
    }).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect_spark(connect_server: ConnectServer) -> Iterator[Any]:
    """A Spark Connect session of `connect_server`, with the redrive-kafka source registered."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server.remote).create()
    register(session)
    yield session
    session.stop()


class ClusterSession:
    """A classic SparkSession on a standalone cluster, in the cluster_runner.py process.

    run(job, **arguments) sends one job and returns its JSON answer; a job that failed raises
    with the runner's error. The runner's own output (Spark's log) goes to `log_path`.
    """

    def __init__(self, cluster: StandaloneCluster, log_path: Path) -> None:
        self.cluster = cluster
        self.log_path = log_path
        with log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, str(RUNNER), cluster.master_url], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        self._answers: IO[str] = self._process.stdout  # type: ignore[assignment]
        try:
            hello = self._receive(RUNNER_READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.app_id: str = hello["app_id"]
        self.master: str = hello["master"]

    def run(self, job: str, timeout_s: float = 180.0, **arguments: Any) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"job": job, **arguments}) + "\n")
        self._process.stdin.flush()
        return self._receive(timeout_s)

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        ready, _, _ = select.select([self._answers], [], [], timeout_s)
        line = self._answers.readline() if ready else ""
        if not line:
            state = ("exited with code " + str(self._process.poll())
                     if self._process.poll() is not None else f"no answer in {timeout_s}s")
            raise AssertionError(f"cluster runner {state}; see {self.log_path}:\n"
                                 f"{self.log_path.read_text(errors='replace')[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"cluster job failed: {answer['error']}")
        return answer

    def close(self) -> None:
        """Ask the runner to stop its session; kill it by pid if it does not within 30 s."""
        process = self._process
        if process.poll() is None:
            with contextlib.suppress(OSError):
                assert process.stdin is not None
                process.stdin.close()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._answers.close()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone cluster (master and one 1-core worker) from the pyspark wheel."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_spark(spark_cluster: StandaloneCluster) -> Iterator[ClusterSession]:
    """A classic SparkSession with master=the cluster's URL, in a process of its own."""
    session = ClusterSession(spark_cluster, spark_cluster.work_dir / "runner.log")
    try:
        yield session
    finally:
        session.close()


def produce_transactions(bootstrap: str, topic: str, transactional_id: str,
                         transactions: list[tuple[list[str], bool]]) -> None:
    """Produce each (values, commit) as one transaction, committed or aborted."""
    producer = kafka.producer(bootstrap, transactional_id=transactional_id)
    producer.init_transactions()
    for values, commit in transactions:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value.encode())
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()


def query_checkpoint(path: Path) -> str:
    """A checkpoint directory as a started query leaves it, for tests that call a pipeline's
    foreachBatch body themselves: Spark's metadata file naming a new query id."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    return str(path)
