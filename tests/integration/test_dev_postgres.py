"""The throwaway PostgreSQL server (redrive.dev.postgres), against the installed binaries."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from redrive.dev.postgres import DevPostgres, DevPostgresError

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


@pytest.fixture
def temp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the server's temporary dirs are made, for the test to see what is left there; the
    server's user can reach it (pytest's tmp_path is the test runner's alone)."""
    shared = Path(tempfile.mkdtemp(prefix="redrive-test-postgres-"))
    shared.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    try:
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_port_in_use_fails_naming_it_and_leaves_the_other_server_alone(
        temp_root: Path) -> None:
    with DevPostgres(durable=False) as other:
        server = DevPostgres(durable=False, port=other.port)
        with pytest.raises(DevPostgresError, match=f"port {other.port} on 127.0.0.1 is already "
                                                   "in use"):
            server.start()
        assert server.root is None and list(temp_root.iterdir()) == [other.root]
        psycopg.connect(other.url).close()


def test_a_server_that_is_not_ours_answering_on_the_port_is_not_taken_for_ours(
        temp_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DevPostgres(durable=False) as other:
        # As if the other server had bound the port after the check said it was free.
        monkeypatch.setattr("redrive.dev.postgres.port_in_use", lambda port: None, raising=False)
        server = DevPostgres(durable=False, port=other.port)
        with pytest.raises(DevPostgresError, match=r"another PostgreSQL server|exited at start"):
            server.start()
        assert server.root is None and list(temp_root.iterdir()) == [other.root]
        psycopg.connect(other.url).close()


def test_a_failing_initdb_leaves_no_dir(temp_root: Path) -> None:
    fake_bin = temp_root / "bin"
    fake_bin.mkdir()
    initdb = fake_bin / "initdb"
    initdb.write_text("#!/bin/sh\necho 'initdb: directory exists but is not empty' >&2\nexit 1\n")
    initdb.chmod(0o755)
    server = DevPostgres(durable=False)
    server.bin = fake_bin
    with pytest.raises(DevPostgresError, match=r"initdb failed \(1\): initdb: directory exists"):
        server.start()
    assert list(temp_root.iterdir()) == [fake_bin]


def test_a_missing_server_user_leaves_no_dir(temp_root: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr("redrive.dev.postgres.SERVER_USER", "no-such-user-for-redrive")
    with pytest.raises(DevPostgresError, match="user 'no-such-user-for-redrive' to run"):
        DevPostgres(durable=False)
    assert list(temp_root.iterdir()) == []
