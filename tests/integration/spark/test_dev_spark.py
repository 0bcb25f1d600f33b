"""redrive.dev.spark's failures: a Spark JVM that exits or is not ready in time is named, with its
command and log, and nothing of it is left running."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from redrive.dev.spark import ConnectServer, DevSparkError

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
