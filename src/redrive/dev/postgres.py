"""A throwaway PostgreSQL server for tests, benchmarks and the demo; never used in production.

It runs the binaries of an installed PostgreSQL (Debian's `postgresql` package keeps them in
/usr/lib/postgresql/<version>/bin): initdb into a temporary dir, then `postgres` on a free port
of the loopback address, with trust authentication. PostgreSQL refuses to run as root, so a root
process runs it as the `postgres` user (which the package creates) and hands it the dir. On Linux
the server gets SIGINT (fast shutdown) if the Python process dies without running its exit
handlers: smart shutdown (SIGTERM) would wait for sessions of the dead process's own children. The
data dir is left behind then.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from redrive.dev.lifetime import tied_to_parent
from redrive.dev.ports import free_port
from redrive.errors import RedriveError

HOST = "127.0.0.1"
SEARCH = "/usr/lib/postgresql"
SERVER_USER = "postgres"


class DevPostgresError(RedriveError):
    """The development PostgreSQL server could not be found or started."""


def bin_dir() -> Path:
    """Where initdb and postgres are: on PATH, or the newest version Debian installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(Path(SEARCH).glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                      else 0)
    if not versions:
        raise DevPostgresError("PostgreSQL is not installed (no initdb on PATH or under "
                               f"{SEARCH}); install Debian's postgresql package "
                               "(make postgres does)")
    return versions[-1].parent


_RUNNING: set[DevPostgres] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


class DevPostgres:
    """One PostgreSQL server in its own temporary dir; stop() removes the dir.

    durable=False turns fsync off: much faster, and enough for tests (the data dir dies anyway).
    """

    def __init__(self, *, durable: bool = True, port: int | None = None) -> None:
        self.bin = bin_dir()
        self.port = port or free_port()
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="redrive-postgres-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam(SERVER_USER)
            except KeyError as exc:
                raise DevPostgresError(f"running as root, and user {SERVER_USER!r} to run "
                                       "PostgreSQL as does not exist") from exc
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._user = SERVER_USER

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        return f"postgresql://{SERVER_USER}@{HOST}:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        result = subprocess.run([str(self.bin / args[0]), *args[1:]], user=self._user,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DevPostgresError(f"{args[0]} failed ({result.returncode}): "
                                   f"{(result.stderr or result.stdout).strip()[-2000:]}")

    def start(self, timeout_s: float = 60.0) -> DevPostgres:
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-U", SERVER_USER, "--auth=trust",
                  "--encoding=UTF8", "--no-sync")
        settings = ["-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={self.root}",
                    "-c", "max_connections=200"]
        if not self.durable:
            settings += ["-c", "fsync=off", "-c", "synchronous_commit=off",
                         "-c", "full_page_writes=off"]
        log = (self.root / "postgres.log").open("wb")
        # setpriv sets the parent-death signal after Popen has switched to the server's user (a
        # switch would clear it). A new session keeps a terminal's Ctrl-C away: stop() ends it.
        self._process = subprocess.Popen(
            tied_to_parent([str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port),
                            *settings], signal.SIGINT),
            user=self._user, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        _RUNNING.add(self)
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        import psycopg

        last = ""
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise DevPostgresError(f"postgres exited at start: {self.log_tail()}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.1)
        raise DevPostgresError(f"postgres on port {self.port} not ready in time: {last}")

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        database = name or f"redrive_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        return self.database_url(database)

    def log_tail(self, chars: int = 2000) -> str:
        path = self.root / "postgres.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, grace_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT: sessions are ended), then remove the dir."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        _RUNNING.discard(self)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DevPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
