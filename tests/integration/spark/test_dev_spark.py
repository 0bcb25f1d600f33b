"""redrive.dev.spark's failures: a Spark JVM that exits or is not ready in time is named, with its
command and log, and nothing of it is left running."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from redrive.dev.ports import free_port
from redrive.dev.spark import ConnectServer, DevSparkError, StandaloneCluster

pytestmark = [pytest.mark.spark]


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    server = ConnectServer(tmp_path, master="no-such-master")
    with pytest.raises(DevSparkError) as raised:
        server.start(timeout_s=60)
    message = str(raised.value)
    assert "exited with code 1" in message
    assert "spark-submit --class org.apache.spark.sql.connect" in message
    assert str(server.log_path) in message
    assert "Master must either be yarn or start with spark" in message  # the log's tail
    assert not server.running


def test_a_server_not_ready_in_time_is_stopped(tmp_path: Path) -> None:
    server = ConnectServer(tmp_path)
    with pytest.raises(DevSparkError, match=r"not ready within 0\.3s") as raised:
        server.start(timeout_s=0.3)
    assert server.remote.removeprefix("sc://") in str(raised.value)
    assert str(server.log_path) in str(raised.value)
    found = re.search(r"\(pid (\d+)\)", str(raised.value))
    assert found is not None
    pid = int(found.group(1))
    assert group_gone(pid)
    assert not server.running


class FakeConnect(ConnectServer):
    """A Connect server whose JVM is `jvm` ({port} is its port): the readiness rules without
    Spark's start-up time."""

    def __init__(self, work_dir: Path, jvm: Sequence[str]) -> None:
        self.jvm = list(jvm)
        super().__init__(work_dir)

    def command(self) -> list[str]:
        return [part.replace("{port}", str(self.port)) for part in self.jvm]


LISTENER = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "time.sleep(60)")


def test_a_server_whose_jvm_listens_on_its_port_is_ready(tmp_path: Path) -> None:
    server = FakeConnect(tmp_path, [sys.executable, "-c", LISTENER])
    server.start(timeout_s=30)
    try:
        assert server.running
    finally:
        server.stop(grace_s=5)


def test_an_earlier_runs_started_line_in_the_log_does_not_make_a_new_server_ready(
        tmp_path: Path) -> None:
    server = FakeConnect(tmp_path, ["sleep", "30"])
    server.log_path.write_text("--- an earlier start in this work dir\nINFO SparkConnectServer: "
                               f"Spark Connect server started at: /127.0.0.1:{server.port}\n")
    with pytest.raises(DevSparkError, match=r"not ready within 1\.0s"):
        server.start(timeout_s=1.0)
    assert not server.running


def test_another_process_listening_on_the_port_is_not_taken_for_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeConnect(tmp_path, ["sleep", "30"])
    # As if the other process had bound the port after the check said it was free.
    monkeypatch.setattr("redrive.dev.spark._check_ports_free", lambda name, ports: None)
    with socket.socket() as other:
        other.bind(("127.0.0.1", server.port))
        other.listen()
        with pytest.raises(DevSparkError, match=r"not ready within 1\.0s"):
            server.start(timeout_s=1.0)
    assert not server.running


def test_a_cluster_started_again_in_its_work_dir_finds_this_runs_master_ui(
        tmp_path: Path) -> None:
    earlier = free_port()
    (tmp_path / "master.log").write_text(
        "--- an earlier start in this work dir\n"
        f"INFO Utils: Successfully started service 'MasterUI' on port {earlier}.\n")
    cluster = StandaloneCluster(tmp_path)
    cluster.start(timeout_s=90)
    try:
        assert cluster.ui_url == f"http://127.0.0.1:{cluster.master_ui_port}"
        assert int(cluster.master_state()["aliveworkers"]) == 1
    finally:
        cluster.stop()
