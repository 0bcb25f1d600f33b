"""The throwaway PostgreSQL server (redrive.dev.postgres), against the installed binaries."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def process_gone(pid: int, timeout_s: float = 20.0) -> bool:
    """Gone or a zombie: an orphan's zombie lasts until init gets round to reaping it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


ORPHAN_SCRIPT = """
import time
from redrive.dev.postgres import DevPostgres
server = DevPostgres(durable=False).start()
print(server._process.pid, server.root, flush=True)
time.sleep(120)
"""


def test_a_sigkilled_parent_takes_its_server_with_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE,
                              text=True)
    server_pid, root = 0, ""
    try:
        assert parent.stdout is not None
        pid, root = parent.stdout.readline().split()
        server_pid = int(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert process_gone(server_pid), f"postgres pid {server_pid} outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if server_pid and not process_gone(server_pid, 0):
            os.kill(server_pid, signal.SIGKILL)
        # Nothing is left to remove the dead parent's data dir.
        if root:
            shutil.rmtree(root, ignore_errors=True)
